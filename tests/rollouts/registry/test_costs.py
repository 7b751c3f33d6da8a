"""What a version costs (rollouts/registry/costs.py) and its API: unit-seconds per 1,000
requests from a benchmark's most load within the SLO and from live traffic, checked against a
hand computation from the recorded numbers; money from the platform's prices; the comparison
a rollout shows; the chargeback per tenant and day or month, as JSON and CSV, to its tenant's
members only; prices set by platform admins only."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from fleet.models import DevicePrice, Placement
from rollouts.models import LatencyRollup, ModelLoad
from rollouts.registry import costs
from tests.api.benchmark_rows import finished_job
from tests.factories import (
    AliasFactory,
    ClusterFactory,
    DeploymentFactory,
    InferenceServerFactory,
    ModelFactory,
    ModelVersionFactory,
)

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)


@pytest.fixture
def world(tenant_a):
    cluster = ClusterFactory(name="costs")
    server = InferenceServerFactory(cluster=cluster, name="gpu-1")
    model = ModelFactory(tenant=tenant_a, name="scorer")
    v1, v2 = (ModelVersionFactory(model=model, version=n) for n in (1, 2))
    deployment = DeploymentFactory(tenant=tenant_a, model=model, cluster=cluster, name="prod")
    deployment.servers.set([server])
    return type("World", (), {"server": server, "model": model, "v1": v1, "v2": v2,
                              "deployment": deployment, "tenant": tenant_a})


def hold(world, version, units, start, end=None, device_class="cpu"):
    """A placement of ``units`` from ``start`` (released at ``end``), and its ready load."""
    placement = Placement.objects.create(
        tenant=world.tenant, server=world.server, model_version=version,
        device_class=device_class, units=units, memory_mib=1,
        state=Placement.State.RELEASED if end else Placement.State.ACTIVE, released_at=end)
    Placement.objects.filter(pk=placement.pk).update(created_at=start)
    ModelLoad.objects.create(tenant=world.tenant, deployment=world.deployment, server=world.server,
                             version=version, placement=placement,
                             state=ModelLoad.State.UNLOADED if end else ModelLoad.State.READY)
    return placement


def served(world, label, requests_by_minute, start):
    for i, n in enumerate(requests_by_minute):
        LatencyRollup.objects.create(deployment=world.deployment, label=label,
                                     minute=start + timedelta(minutes=i), requests=n)


def test_the_live_reading_is_unit_seconds_held_over_requests_served(world):
    # 2 units for the last 10 hours, 1 more for 2 hours of them; 90,000 requests served.
    hold(world, world.v1, 2, NOW - timedelta(hours=10))
    hold(world, world.v1, 1, NOW - timedelta(hours=6), end=NOW - timedelta(hours=4))
    served(world, "v1", [1500] * 60, NOW - timedelta(hours=1))
    # Outside the 24 h window: neither held nor served counts.
    hold(world, world.v1, 8, NOW - timedelta(days=3), end=NOW - timedelta(days=2))
    served(world, "v1", [10_000], NOW - timedelta(days=2))
    DevicePrice.objects.create(device_class="cpu", per_unit_hour=Decimal("0.36"))

    reading = costs.live_reading(world.v1, end=NOW)

    by_hand_unit_s = 2 * 10 * 3600 + 1 * 2 * 3600  # 79,200
    assert reading.numbers["requests"] == 90_000
    assert reading.unit_seconds_per_1000 == pytest.approx(by_hand_unit_s * 1000 / 90_000,
                                                          rel=0.01)
    assert reading.price == pytest.approx(by_hand_unit_s * 1000 / 90_000 / 3600 * 0.36, rel=0.01)
    assert reading.currency == "USD" and reading.device_class == "cpu"

    # Beside a version that held as much for a tenth of the requests (a canary), the
    # comparison says it is read as each was used, idle capacity included.
    hold(world, world.v2, 2, NOW - timedelta(hours=10))
    hold(world, world.v2, 1, NOW - timedelta(hours=6), end=NOW - timedelta(hours=4))
    served(world, "v2", [150] * 60, NOW - timedelta(hours=1))
    compared = costs.compare(world.v2, world.v1, end=NOW)
    assert compared["source"] == "live" and compared["change_pct"] == pytest.approx(900.0, rel=0.02)
    assert "9,000 and 90,000 requests" in compared["message"]
    assert "benchmark both to compare them at the same load" in compared["message"]


def test_the_benchmark_reading_is_units_over_the_most_load_within_the_slo(world):
    finished_job(world.deployment, world.v1, rps=240.0)
    finished_job(world.deployment, world.v2, rps=200.0)

    one, two = costs.benchmark_reading(world.v1), costs.benchmark_reading(world.v2)

    # One model instance (the cpu class) carried 240 requests a second: 1,000 take 4.17 s.
    assert one.unit_seconds_per_1000 == pytest.approx(1000 / 240)
    assert one.price is None  # no price set for the class
    compared = costs.compare(world.v2, world.v1)
    assert compared["source"] == "benchmark"
    assert compared["change_pct"] == pytest.approx(20.0)
    assert compared["message"].startswith("v2 costs 20% more per request than v1")
    assert two.numbers["max_load_rps"] == 200.0


def test_without_a_common_reading_the_comparison_says_what_to_do(world):
    finished_job(world.deployment, world.v1, rps=240.0)
    compared = costs.compare(world.v2, world.v1)
    assert compared["change_pct"] is None and "benchmark both" in compared["message"]
    # Too little traffic to divide by is said, not divided.
    hold(world, world.v2, 1, NOW - timedelta(hours=1))
    served(world, "v2", [10], NOW - timedelta(minutes=30))
    reading = costs.live_reading(world.v2, end=NOW)
    assert reading.unit_seconds_per_1000 is None and "too few" in reading.note


def test_the_chargeback_counts_each_tenants_unit_hours_per_day(world, tenant_b):
    hold(world, world.v1, 2, datetime(2026, 11, 1, 18, tzinfo=UTC),
         end=datetime(2026, 11, 2, 6, tzinfo=UTC))
    DevicePrice.objects.create(device_class="cpu", per_unit_hour=Decimal("1.5"), currency="EUR")

    rows = costs.chargeback(None, datetime(2026, 11, 1, tzinfo=UTC),
                            datetime(2026, 11, 3, tzinfo=UTC), "day")

    assert [(r["period"], r["unit_hours"], r["cost"], r["currency"]) for r in rows] == [
        ("2026-11-01", 12.0, 18.0, "EUR"), ("2026-11-02", 12.0, 18.0, "EUR")]
    month = costs.chargeback(None, datetime(2026, 10, 1, tzinfo=UTC),
                             datetime(2026, 12, 1, tzinfo=UTC), "month")
    assert [(r["period"], r["unit_hours"]) for r in month] == [("2026-11", 24.0)]
    assert costs.chargeback([tenant_b.pk], datetime(2026, 11, 1, tzinfo=UTC),
                            datetime(2026, 11, 3, tzinfo=UTC)) == []


def test_the_api_answers_cost_and_chargeback_to_members_only(world, client_for, bob, charlie):
    finished_job(world.deployment, world.v1, rps=240.0)
    hold(world, world.v1, 1, timezone.now() - timedelta(hours=2))
    mine, theirs = client_for(bob), client_for(charlie)

    answer = mine.get(f"/api/v1/versions/{world.v1.pk}/cost/")
    assert answer.status_code == 200
    assert answer.json()["benchmark"]["unit_seconds_per_1000"] == pytest.approx(1000 / 240)
    assert theirs.get(f"/api/v1/versions/{world.v1.pk}/cost/").status_code == 404

    rows = mine.get("/api/v1/chargeback/").json()["rows"]
    assert {r["tenant"] for r in rows} == {world.tenant.slug}
    assert rows and rows[-1]["unit_hours"] > 0
    assert theirs.get("/api/v1/chargeback/").json()["rows"] == []
    as_csv = mine.get("/api/v1/chargeback/?format=csv")
    assert as_csv.status_code == 200 and as_csv["Content-Type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(as_csv.content.decode())))
    assert [r["tenant"] for r in parsed] == [r["tenant"] for r in rows]
    described = mine.options("/api/v1/chargeback/?format=csv")
    assert described.status_code == 200 and described["Content-Type"] == "application/json"


@pytest.mark.parametrize(("query", "field"), [
    ("period=week", "period"), ("from=2026-13-01", "from"), ("to=yesterday", "to"),
    ("from=2026-11-10&to=2026-11-01", "to"), ("from=2020-01-01&to=2026-11-01", "to"),
    ("from=0001-01-01", "from"), ("to=2026-11-01%00", "to"),
])
def test_bad_chargeback_input_is_a_400_naming_the_field(client_for, bob, query, field):
    for asked in (query, f"{query}&format=csv"):  # a refusal is JSON either way
        answer = client_for(bob).get(f"/api/v1/chargeback/?{asked}")
        assert answer.status_code == 400, answer.content
        assert answer["Content-Type"] == "application/json" and field in answer.json()


def test_prices_are_set_by_platform_admins_and_read_by_members(client_for, root, alice, bob):
    body = {"device_class": "nvidia-a100-80gb", "per_unit_hour": "2.75", "currency": "USD"}
    assert client_for(alice).post("/api/v1/device-prices/", body).status_code == 403
    made = client_for(root).post("/api/v1/device-prices/", body)
    assert made.status_code == 201, made.content
    assert client_for(bob).get("/api/v1/device-prices/").json()["results"][0][
        "per_unit_hour"] == 2.75
    for bad, field in (({"per_unit_hour": "-1"}, "per_unit_hour"),
                       ({"currency": "dollars"}, "currency"),
                       ({"device_class": "Not A Slug"}, "device_class"),
                       ({"device_class": "nvidia-a100-80gb"}, "device_class")):
        refused = client_for(root).post("/api/v1/device-prices/", {**body, **bad})
        assert refused.status_code == 400 and field in refused.json(), refused.content


def test_a_price_with_no_exact_binary_form_is_kept_to_four_places(client_for, root):
    # 0.9 and 0.1 are JSON numbers every client sends; as floats they carry 50 digits.
    made = client_for(root).post("/api/v1/device-prices/", {"device_class": "nvidia-l4",
                                                            "per_unit_hour": 0.9}, format="json")
    assert made.status_code == 201, made.content
    changed = client_for(root).patch(f"/api/v1/device-prices/{made.json()['id']}/",
                                     {"per_unit_hour": 0.12345}, format="json")
    assert changed.status_code == 200, changed.content
    assert DevicePrice.objects.get().per_unit_hour == Decimal("0.1235")
    assert changed.json()["per_unit_hour"] == 0.1235


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_version_page_says_what_it_costs_against_what_it_would_replace(world, bob, charlie):
    finished_job(world.deployment, world.v1, rps=240.0)
    finished_job(world.deployment, world.v2, rps=200.0)
    AliasFactory(model=world.model, name="production", version=world.v1)
    DevicePrice.objects.create(device_class="cpu", per_unit_hour=Decimal("0.36"))

    page = signed_in(bob).get(f"/registry/versions/{world.v2.pk}/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "v2 costs 20% more per request than v1" in text
    # 1,000 / 200 instance-seconds, at 0.36 an hour.
    assert "5.000 instance-seconds" in text and "0.0005 USD" in text
    assert signed_in(charlie).get(f"/registry/versions/{world.v2.pk}/").status_code == 404


def test_a_canary_shows_its_candidates_cost_against_its_baseline_before_promotion(world, bob,
                                                                                client_for):
    from rollouts.models import Rollout

    finished_job(world.deployment, world.v1, rps=240.0)
    finished_job(world.deployment, world.v2, rps=300.0)
    canary = Rollout.objects.create(
        tenant=world.tenant, deployment=world.deployment, baseline=world.v1, candidate=world.v2,
        state=Rollout.State.PROGRESSING, steps=[{"set_weight": 5}], weights={"1": 95, "2": 5})

    answer = client_for(bob).get(f"/api/v1/rollouts/{canary.pk}/cost/")
    assert answer.status_code == 200
    assert answer.json()["change_pct"] == pytest.approx(-20.0)
    page = signed_in(bob).get(f"/registry/rollouts/{canary.pk}/").content.decode()
    assert "v2 costs 20% less per request than v1" in page
    split = Rollout.objects.create(
        tenant=world.tenant, deployment=world.deployment, strategy=Rollout.Strategy.AB,
        baseline=world.v1, state=Rollout.State.SUCCEEDED, steps=[], weights={"1": 50, "2": 50})
    refused = client_for(bob).get(f"/api/v1/rollouts/{split.pk}/cost/")
    assert refused.status_code == 400 and "strategy" in refused.json()


def test_the_cost_step_is_checked_when_a_rollout_is_asked_for():
    from console.exceptions import DomainError
    from rollouts.canary import specs as rollout_specs

    assert rollout_specs.parse_steps([{"cost": {}}]) == [{"cost": {"max_increase_pct": 10.0}}]
    assert rollout_specs.parse_steps([{"cost": {"max_increase_pct": 0}}])[0] == {
        "cost": {"max_increase_pct": 0.0}}
    for bad in ({"max_increase_pct": -1}, {"max_increase_pct": 1001}, {"max_increase_pct": "x"},
                {"max_increase_pct": float("nan")}, {"other": 1}, []):
        with pytest.raises(DomainError) as caught:
            rollout_specs.parse_steps([{"set_weight": 5}, {"cost": bad}])
        assert caught.value.field == "steps[1]"
