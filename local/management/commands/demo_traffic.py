"""``manage.py demo_traffic``: steady client traffic on the demo's routes, for a while.

A canary is judged on real requests: with the demo running (``./scripts/demo``), this sends
inference requests to every route in force (or the deployment named) at about ``--rps`` a
second for ``--seconds`` (default 10 minutes), then stops by itself; Ctrl-C stops it sooner.
It prints what each route answered every 10 seconds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.models import Route
from rollouts.traffic.routes import DEFAULT_INPUT

MAX_SECONDS = 24 * 3600
MAX_RPS = 2000


def _request(route: Route) -> tuple[str, dict[str, Any]]:
    model = route.deployment.model.name
    if route.protocol == "kserve-v2":
        return f"/v2/models/{model}/infer", {"inputs": [DEFAULT_INPUT]}
    return "/v1/chat/completions", {"model": model, "max_tokens": 8,
                                    "messages": [{"role": "user", "content": "Hello"}]}


class Command(BaseCommand):
    help = "Send steady inference traffic to the demo's routes for a while (bounded)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--deployment", help="name of one deployment (default: every route)")
        parser.add_argument("--rps", type=float, default=100.0, help="requests a second a route")
        parser.add_argument("--seconds", type=float, default=600.0, help="how long (max 24 h)")

    def handle(self, *args: Any, deployment: str | None, rps: float, seconds: float,
               **options: Any) -> None:
        if not 0 < rps <= MAX_RPS:
            raise CommandError(f"--rps runs from above 0 to {MAX_RPS}")
        if not 0 < seconds <= MAX_SECONDS:
            raise CommandError(f"--seconds runs from above 0 to {MAX_SECONDS}")
        routes = Route.objects.filter(state=Route.State.IN_FORCE).exclude(url="").select_related(
            "deployment__model")
        if deployment:
            routes = routes.filter(deployment__name=deployment)
        chosen = list(routes)
        if not chosen:
            raise CommandError("no route in force" + (f" for {deployment}" if deployment else "")
                               + ": start the demo (./scripts/demo) and wait for its routes")
        stop = threading.Event()
        counts: dict[str, Counter] = {r.deployment.name: Counter() for r in chosen}
        threads = [threading.Thread(target=self._send, args=(r, rps, seconds, stop,
                                                             counts[r.deployment.name]),
                                    daemon=True) for r in chosen]
        for route in chosen:
            self.stdout.write(f"{route.deployment.name}: {rps:g} requests/s to {route.url} "
                              f"for {seconds:g} s")
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(10 / len(threads))
                for name, seen in counts.items():
                    self.stdout.write(f"{name}: " + ", ".join(
                        f"{status or 'no answer'}: {n}" for status, n in sorted(seen.items())))
        except KeyboardInterrupt:
            stop.set()
        for thread in threads:
            thread.join(5)

    @staticmethod
    def _send(route: Route, rps: float, seconds: float, stop: threading.Event,
              seen: Counter) -> None:
        path, body = _request(route)
        gap = 1.0 / rps
        end = time.monotonic() + seconds
        due = time.monotonic()
        with httpx.Client(base_url=route.url, timeout=5) as client:
            while not stop.is_set() and time.monotonic() < end:
                try:
                    seen[client.post(path, json=body).status_code] += 1
                except httpx.HTTPError:
                    seen[0] += 1
                due += gap
                pause = due - time.monotonic()
                if pause > 0:
                    stop.wait(pause)
                else:
                    due = time.monotonic()  # behind: do not burst to catch up
