"""``manage.py collect_samples``: receive the routers' per-request samples into Redis."""

from __future__ import annotations

import signal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from rollouts.traffic import samples
from rollouts.traffic.collector import BATCH_SIZE, FLUSH_S, Collector


class Command(BaseCommand):
    help = (
        "Listen for routers' JSON access-log lines (UDP syslog: nginx's, or an Envoy "
        "gateway's sent by a log shipper) and store them as per-request samples in Redis, "
        "batched every 100 ms, until SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--host", default=getattr(settings, "SWITCHYARD_COLLECTOR_HOST", "127.0.0.1"),
            help="address to listen on (default SWITCHYARD_COLLECTOR_HOST, 127.0.0.1; "
            "0.0.0.0 for routers on other hosts)",
        )
        parser.add_argument(
            "--port", type=int, default=getattr(settings, "SWITCHYARD_COLLECTOR_PORT", 5514),
            help="UDP port (default SWITCHYARD_COLLECTOR_PORT, 5514)",
        )
        parser.add_argument("--flush-ms", type=int, default=int(FLUSH_S * 1000),
                            help="write a batch once its first line is this old (100)")
        parser.add_argument("--batch", type=int, default=BATCH_SIZE,
                            help="write a batch once it holds this many lines (500)")
        parser.add_argument("--keep-s", type=int, default=samples.keep_s(),
                            help="seconds of samples kept (SWITCHYARD_SAMPLES_KEEP_S, 3600)")
        parser.add_argument(
            "--max-per-variant", type=int, default=samples.max_per_variant(),
            help="samples kept per variant at most (SWITCHYARD_SAMPLES_MAX_PER_VARIANT, 100000)",
        )

    def handle(self, *args: Any, host: str, port: int, flush_ms: int, batch: int, keep_s: int,
               max_per_variant: int, **options: Any) -> None:
        if min(flush_ms, batch, keep_s, max_per_variant) < 1:
            raise CommandError(
                "--flush-ms, --batch, --keep-s and --max-per-variant must be at least 1"
            )
        try:
            collector = Collector(host, port, flush_s=flush_ms / 1000, batch_size=batch,
                                  keep_s=keep_s, max_per_variant=max_per_variant)
        except OSError as exc:
            raise CommandError(f"cannot listen on udp://{host}:{port}: {exc}") from None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: collector.stop())
        self.stdout.write(
            f"collecting samples on udp://{collector.host}:{collector.port} into "
            f"Redis at {_where(settings.REDIS_URL)} (keys {settings.SWITCHYARD_REDIS_PREFIX}:samples:*)"
        )
        self.stdout.flush()
        collector.run()
        counts = ", ".join(f"{k} {v}" for k, v in sorted(collector.counts.items())) or "nothing"
        self.stdout.write(f"collector stopped; {counts}")


def _where(url: str) -> str:
    """A Redis URL without its credentials."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}{parts.path}"
