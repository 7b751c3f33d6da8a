"""``manage.py seed_demo``: load the demo tenants, users, models, quotas and clusters."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from local import demo


class Command(BaseCommand):
    help = "Seed demo data (idempotent). Every demo user gets --password."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", default="switchyard-demo")
        parser.add_argument("--s3-endpoint", default=None, help="upload the artifacts there")
        parser.add_argument(
            "--vllm", action="store_true",
            help="also seed a LoRA adapter model for the local vLLM (needs --s3-endpoint)",
        )
        parser.add_argument(
            "--load", action="store_true",
            help="then load the approved versions: onto the local Triton here, one deployment "
            "after the other, each given its route once ready (so the route ports are the same "
            "at every start); onto vLLM by a worker",
        )

    def handle(
        self, *args: Any, password: str, s3_endpoint: str | None, vllm: bool, load: bool,
        **options: Any,
    ) -> None:
        demo.seed(password, s3_endpoint)
        if vllm:
            if not s3_endpoint:
                raise CommandError("--vllm needs --s3-endpoint")
            demo.seed_vllm(s3_endpoint)
        self.stdout.write(self.style.SUCCESS("demo data ready"))
        if load:
            started = demo.request_demo_loads(with_vllm=vllm)
            self.stdout.write(f"requested {len(started)} model load{'' if len(started) == 1 else 's'}")
            for route in demo.route_in_order(started):
                self.stdout.write(f"route of {route.deployment.name}: {route.url}")
