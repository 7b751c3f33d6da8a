"""Switchyard project package: settings, URLs, Celery app and the cross-app console."""

from .celery import app as celery_app

__all__ = ("celery_app",)
