"""``manage.py demo_traffic``: bounded client traffic on the routes in force (real Triton and
nginx), so that a canary in the demo has requests to be judged on."""

from __future__ import annotations

import io
import re
import time

import pytest
from django.core.management import CommandError, call_command

from rollouts.loads import reconciler
from rollouts.loads import requests as loads
from rollouts.models import ModelLoad, Route
from rollouts.traffic import routes


def test_bad_arguments_and_no_route_are_refused_with_a_reason(db):
    for kwargs, said in [({"rps": 0}, "--rps"), ({"seconds": 10**9}, "--seconds"),
                         ({}, "no route in force")]:
        with pytest.raises(CommandError, match=said):
            call_command("demo_traffic", **kwargs)


@pytest.mark.triton
@pytest.mark.django_db(transaction=True)
def test_it_sends_about_the_rate_asked_for_and_stops_by_itself(world, use_route_nginx):
    rows, _ = loads.request_load(world.user, world.deployment, world.version(1))
    assert reconciler.run_to_end(rows[0].pk).state == ModelLoad.State.READY
    routes.ensure_route(world.user, world.deployment)
    out = io.StringIO()
    started = time.monotonic()
    try:
        call_command("demo_traffic", rps=40, seconds=2, stdout=out)
    finally:
        Route.objects.filter(pk=world.deployment.pk).delete()
    took = time.monotonic() - started
    answered = [int(n) for n in re.findall(r"200: (\d+)", out.getvalue())]
    assert answered, out.getvalue()
    # 40 a second for 2 s is 80; the pacing never bursts, a slow machine sends fewer.
    assert 20 <= answered[-1] <= 81, out.getvalue()
    assert took < 15
