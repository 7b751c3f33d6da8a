"""``manage.py fleet_sim``: serve simulated Triton and vLLM servers on 127.0.0.1 for scale
tests and benchmarks (see :mod:`local.fleetsim`), printing where each one is.

    manage.py fleet_sim --triton 1000 --models 2 --rps 20 --hung 0-19 --seconds 600 --json
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from local import fleetsim


class Command(BaseCommand):
    help = fleetsim.DESCRIPTION

    def add_arguments(self, parser: CommandParser) -> None:
        fleetsim.add_arguments(parser)

    def handle(self, *args: object, **options: object) -> None:
        namespace = fleetsim.argparse.Namespace(**options)
        if fleetsim.run(namespace, self.stdout) != 0:
            raise CommandError("the fleet simulator did not start")
