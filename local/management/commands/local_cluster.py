"""``manage.py local_cluster up|down|status|vllm|nginx``: run the local cluster's real Triton,
vLLM and nginx."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.inventory import health
from fleet.models import InferenceServer
from local import cluster as local_cluster


class Command(BaseCommand):
    help = (
        "up: start the local tritonserver (demo models loaded unless --empty), register it and "
        "keep it running until Ctrl-C or SIGTERM; vllm: the same for a local vLLM serving "
        "SmolLM2 (its runtime is built on first use: a few minutes, 2.6 GB); nginx: run the "
        "local traffic router, started again from its last good configuration whenever it "
        "dies; down: stop servers started elsewhere; status: probe the Triton."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["up", "down", "status", "vllm", "nginx"])
        parser.add_argument(
            "--empty", action="store_true",
            help="up: start with an empty model repository (versions then come through loads)",
        )

    def handle(self, *args: Any, action: str, empty: bool = False, **options: Any) -> None:
        self.empty = empty
        getattr(self, f"_{action}")()

    def _say(self, message: str) -> None:
        self.stdout.write(message)
        self.stdout.flush()

    def _up(self) -> None:
        try:
            proc = local_cluster.up(progress=self._say, preload=not self.empty)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            while not stop.wait(1.0):
                if not proc.is_running():
                    raise CommandError(f"tritonserver exited; last log lines:\n{proc.log_tail()}")
        finally:
            self._say("stopping local Triton…")
            proc.stop()
            local_cluster.LocalPaths.from_settings().pidfile.unlink(missing_ok=True)
            self._say("local Triton stopped")

    def _vllm(self) -> None:
        """Run the local vLLM until Ctrl-C; a base-model roll may replace its process meanwhile."""
        try:
            local_cluster.up_vllm(progress=self._say)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            stop.wait()
        finally:
            self._say("stopping local vLLM…")
            local_cluster.down_vllm()
            self._say("local vLLM stopped")

    def _nginx(self) -> None:
        """Run the local nginx until Ctrl-C or SIGTERM, restarting it whenever it dies."""
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        try:
            local_cluster.run_nginx(stop, progress=self._say)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        self._say("local nginx stopped")

    def _down(self) -> None:
        if local_cluster.down_nginx():
            self._say("local nginx stopped")
        if local_cluster.down_vllm():
            self._say("local vLLM stopped")
        if local_cluster.down():
            self._say("local Triton stopped")
        else:
            self._say("no local Triton was running")

    def _status(self) -> None:
        server = InferenceServer.objects.filter(
            cluster__name=local_cluster.CLUSTER_NAME, name=local_cluster.SERVER_NAME
        ).first()
        if server is None:
            raise CommandError("the local cluster is not registered; run `local_cluster up`")
        server = health.check_server(server.pk)
        assert server is not None
        self._say(f"{server.name}: {server.health} {server.server_version} {server.health_detail}")
        for m in server.reported_models:
            self._say(f"  {m['name']} v{m['version']}: {m['state']} {m['reason']}")
