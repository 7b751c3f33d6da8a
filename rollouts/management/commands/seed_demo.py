"""``manage.py seed_demo``: load the demo tenants, users, models, quotas and clusters."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from rollouts import demo


class Command(BaseCommand):
    help = "Seed demo data (idempotent). Every demo user gets --password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default="switchyard-demo")

    def handle(self, *args: Any, password: str, **options: Any) -> None:
        demo.seed(password)
        self.stdout.write(self.style.SUCCESS("demo data ready"))
