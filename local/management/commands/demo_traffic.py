"""``manage.py demo_traffic``: steady client traffic on the demo's routes until stopped.

A canary is judged on real requests: with the demo running (``./scripts/demo``), this sends
inference requests to every route in force (or the deployment named) at ``--rps`` a second
each, until Ctrl-C (or for ``--minutes``). Each route gets the request its deployment's page
shows under "How to call it": a body built from the inputs its model declares (the serving
Triton's metadata), or a chat completion for vLLM. Enough requests are in flight at once to
keep the rate while answers are slow; the rate is never made up in bursts. Every 10 seconds it
prints, per route, the rate sent in that window and what the route answered so far.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Any

import httpx
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.adapters.routers.base import OPENAI
from rollouts.deployments import calling
from rollouts.models import Route

MAX_SECONDS = 24 * 3600
MAX_RPS = 2000
REPORT_EVERY_S = 10.0
# Requests in flight per route at most: enough for the rate at answers of up to 250 ms.
IN_FLIGHT_PER_RPS = 0.25
MAX_IN_FLIGHT = 64


def payload(route: Route) -> tuple[str, dict[str, Any]]:
    """The path (under the route's URL) and JSON body of one request the route's model
    answers; a CommandError saying why when the model's inputs cannot be told."""
    name = route.deployment.name
    guide = calling.guide(route.deployment)
    if guide is None:
        raise CommandError(f"{name}: no version is ready on its servers")
    if guide.protocol != OPENAI and not guide.inputs:
        raise CommandError(f"{name}: cannot tell the inputs of {guide.model} v{guide.version} "
                           f"({guide.note or 'its server lists none'})")
    path = guide.endpoint.removeprefix(route.url.rstrip("/"))
    if path == guide.endpoint:
        raise CommandError(f"{name}: its route {route.url} is not in force")
    return path, calling.example_body(guide)


class Pacer:
    """Hands out send times ``1/rps`` apart to the route's senders. A sender that asks late
    gets "now" and the schedule restarts from there: behind schedule, nothing bursts."""

    def __init__(self, rps: float) -> None:
        self.gap = 1.0 / rps
        self.due = time.monotonic()
        self.lock = threading.Lock()

    def next_slot(self) -> float:
        with self.lock:
            slot = max(self.due, time.monotonic())
            self.due = slot + self.gap
            return slot


class Command(BaseCommand):
    help = "Send steady inference traffic to the demo's routes until Ctrl-C (or --minutes)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--deployment", help="name of one deployment (default: every route)")
        # 40 a route: about the 75 requests a second the demo's canary figures were measured
        # at, and what the demo's one Triton carries within its 50 ms SLO on two busy cores
        # (at 100 a route its p99 passed 90 ms there and fraud-scorer-prod breached).
        # 75 a second: the traffic the canary's defaults and benchmarks are sized for.
        parser.add_argument("--rps", type=float, default=75.0, help="requests a second a route")
        parser.add_argument("--minutes", type=float, default=None,
                            help="stop after this long (default: run until Ctrl-C; max 24 h)")
        parser.add_argument("--seconds", type=float, default=None,
                            help="stop after this many seconds (instead of --minutes)")

    def handle(self, *args: Any, deployment: str | None, rps: float, minutes: float | None,
               seconds: float | None, **options: Any) -> None:
        if not 0 < rps <= MAX_RPS:
            raise CommandError(f"--rps runs from above 0 to {MAX_RPS}")
        if minutes is not None and seconds is not None:
            raise CommandError("give --minutes or --seconds, not both")
        duration = minutes * 60 if minutes is not None else seconds
        if duration is not None and not 0 < duration <= MAX_SECONDS:
            raise CommandError(f"--minutes runs from above 0 to {MAX_SECONDS // 60} "
                               f"(--seconds to {MAX_SECONDS})")
        routes = Route.objects.filter(state=Route.State.IN_FORCE).exclude(url="").select_related(
            "deployment__model", "deployment__cluster")
        if deployment:
            routes = routes.filter(deployment__name=deployment)
        chosen = list(routes)
        if not chosen:
            raise CommandError("no route in force" + (f" for {deployment}" if deployment else "")
                               + ": start the demo (./scripts/demo) and wait for its routes")
        requests = {route.pk: payload(route) for route in chosen}
        stop = threading.Event()
        end = time.monotonic() + duration if duration is not None else math.inf
        counts: dict[str, Counter] = {r.deployment.name: Counter() for r in chosen}
        in_flight = max(1, min(MAX_IN_FLIGHT, math.ceil(rps * IN_FLIGHT_PER_RPS)))
        threads = []
        for route in chosen:
            pacer = Pacer(rps)
            path, body = requests[route.pk]
            threads += [threading.Thread(target=send, daemon=True,
                                         args=(route.url, path, body, pacer, end, stop,
                                               counts[route.deployment.name]))
                        for _ in range(in_flight)]
            how_long = "until Ctrl-C" if duration is None else f"for {duration:g} s"
            self.stdout.write(f"{route.deployment.name}: {rps:g} requests/s to "
                              f"{route.url}{path} {how_long}")
        for thread in threads:
            thread.start()
        try:
            self._report(threads, counts, rps, end)
        except KeyboardInterrupt:
            self.stdout.write("stopping…")
        stop.set()
        for thread in threads:
            thread.join(5)
        self._line(counts, {name: 0 for name in counts}, None, "")

    def _report(self, threads: list[threading.Thread], counts: dict[str, Counter],
                rps: float, end: float) -> None:
        """Every REPORT_EVERY_S, each route's rate in that window and its answers so far."""
        before = {name: 0 for name in counts}
        since = time.monotonic()
        while any(t.is_alive() for t in threads):
            deadline = since + REPORT_EVERY_S
            while time.monotonic() < deadline and any(t.is_alive() for t in threads):
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            now = min(time.monotonic(), end)
            self._line(counts, before, now - since, f"asked {rps:g}/s")
            before = {name: sum(seen.values()) for name, seen in counts.items()}
            since = now

    def _line(self, counts: dict[str, Counter], before: dict[str, int], took: float | None,
              note: str) -> None:
        for name, tally in counts.items():
            seen = dict(tally)  # a copy: the senders go on counting
            sent = sum(seen.values())
            rate = f"{(sent - before[name]) / took:.1f} requests/s ({note}); " if took else "in all, "
            answers = ", ".join(f"{status or 'no answer'}: {n}" for status, n in sorted(seen.items()))
            self.stdout.write(f"{name}: {rate}{answers or 'nothing sent yet'}")


def send(url: str, path: str, body: dict[str, Any], pacer: Pacer, end: float,
         stop: threading.Event, seen: Counter) -> None:
    """One of a route's senders: a request at each slot the pacer gives, until ``end`` or
    ``stop``; each answer's status counted (0: no answer)."""
    with httpx.Client(base_url=url, timeout=5) as client:
        while not stop.is_set():
            slot = pacer.next_slot()
            if slot >= end or stop.wait(max(0.0, slot - time.monotonic())):
                return
            try:
                status = client.post(path, json=body).status_code
            except httpx.HTTPError:
                status = 0
            with pacer.lock:  # the route's senders count into one tally
                seen[status] += 1
