"""Celery tasks for the fleet. Thin: they call the domain and return."""

from __future__ import annotations

from celery import shared_task

from fleet import health


@shared_task(ignore_result=True)
def check_servers() -> dict[str, int]:
    """Probe every inference server and traffic router once (beat runs this every few seconds)."""
    counts = health.check_all()
    health.check_routers()
    return counts


@shared_task(ignore_result=True)
def check_server(server_id: int) -> None:
    health.check_server(server_id)
