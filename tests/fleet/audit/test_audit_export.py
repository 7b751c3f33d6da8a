"""The audit log leaves Switchyard as CSV or JSON Lines, streamed, filtered as the page and the
API filter it; retention deletes what is older and says so; the admin's bulk delete leaves the
same trail as deleting one by one."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from fleet.audit import export as audit_export
from fleet.models import AuditEvent, Quota
from tests.factories import QuotaFactory

pytestmark = pytest.mark.django_db


def event(tenant, when: datetime, **fields) -> AuditEvent:
    row = AuditEvent.objects.create(**{"tenant": tenant, "actor_label": "dave", "verb": "updated",
                                       "object_type": "rollouts.deployment", "object_id": "7",
                                       "object_repr": "tenant-a/scorer", **fields})
    AuditEvent.objects.filter(pk=row.pk).update(created_at=when)
    return row


def body(response) -> str:
    assert response.streaming
    return b"".join(response.streaming_content).decode()


@pytest.fixture
def month(tenant_a, tenant_b):
    """Tenant A: one event a day of November 2026 and one in December; tenant B: one."""
    start = datetime(2026, 11, 1, 12, tzinfo=UTC)
    days = [event(tenant_a, start + timedelta(days=d), after={"slo_p99_ms": d}) for d in range(30)]
    late = event(tenant_a, datetime(2026, 12, 2, tzinfo=UTC))
    theirs = event(tenant_b, start, object_repr="tenant-b/other")
    return {"days": days, "late": late, "theirs": theirs}


def test_a_month_exports_to_csv_oldest_first(alice, month):
    api = APIClient()
    api.force_authenticate(alice)
    response = api.get("/api/v1/audit-events/export/", {
        "as": "csv", "since": "2026-11-01T00:00:00Z", "until": "2026-12-01T00:00:00Z"})

    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="switchyard-audit-')
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert [int(r["id"]) for r in rows] == [e.pk for e in month["days"]]
    assert rows[3]["tenant"] == "tenant-a" and json.loads(rows[3]["after"]) == {"slo_p99_ms": 3}
    assert rows[0]["created_at"] == "2026-11-01T12:00:00+00:00"


def test_json_lines_follow_the_same_filters_and_tenancy(charlie, alice, month):
    api = APIClient()
    api.force_authenticate(charlie)
    theirs = [json.loads(line) for line in body(api.get("/api/v1/audit-events/export/", {"as": "jsonl"})).splitlines()]
    api.force_authenticate(alice)
    found = [json.loads(line) for line in body(api.get(
        "/api/v1/audit-events/export/", {"as": "jsonl", "object": "scorer", "actor": "dav"})).splitlines()]

    assert [row["id"] for row in theirs] == [month["theirs"].pk]
    assert len(found) == 31 and {row["object"] for row in found} == {"tenant-a/scorer"}
    assert set(found[0]) == set(audit_export.COLUMNS)


def test_a_cell_a_spreadsheet_would_run_is_quoted(alice, tenant_a):
    event(tenant_a, timezone.now(), reason="=HYPERLINK(\"http://x\")", object_repr="+1")
    api = APIClient()
    api.force_authenticate(alice)
    row = next(csv.DictReader(io.StringIO(body(api.get("/api/v1/audit-events/export/")))))
    assert row["reason"].startswith("'=") and row["object"] == "'+1"


@pytest.mark.parametrize(("params", "field"), [({"as": "xlsx"}, "as"), ({"since": "yesterday"}, "since"),
                                               ({"until": "2026-13-45"}, "until")])
def test_a_bad_export_is_a_400_naming_the_field(alice, params, field):
    api = APIClient()
    api.force_authenticate(alice)
    response = api.get("/api/v1/audit-events/export/", params)
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_the_console_downloads_what_its_filters_select(alice, month):
    client = Client()
    client.force_login(alice)
    response = client.get("/audit/export/", {"as": "jsonl", "since": "2026-12-01T00:00"})
    bad = client.get("/audit/export/", {"as": "pdf"})

    assert [json.loads(line)["id"] for line in body(response).splitlines()] == [month["late"].pk]
    assert bad.status_code == 400 and b"as: must be one of csv, jsonl" in bad.content
    page = client.get("/audit/", {"verb": "updated"}).content.decode()
    assert 'href="/audit/export/?as=csv&amp;verb=updated"' in page


def test_retention_deletes_what_is_older_and_records_it(tenant_a, settings):
    old = event(tenant_a, timezone.now() - timedelta(days=400))
    kept = event(tenant_a, timezone.now() - timedelta(days=10))
    settings.SWITCHYARD_AUDIT_RETENTION_DAYS = 0
    assert audit_export.prune() == 0

    settings.SWITCHYARD_AUDIT_RETENTION_DAYS = 365
    assert audit_export.prune() == 1

    assert not AuditEvent.objects.filter(pk=old.pk).exists()
    assert AuditEvent.objects.filter(pk=kept.pk).exists()
    note = AuditEvent.objects.get(verb="pruned")
    assert note.after["deleted"] == 1 and note.reason == "retention: events are kept 365 days"
    assert audit_export.prune() == 0  # nothing older left: nothing more recorded
    assert AuditEvent.objects.filter(verb="pruned").count() == 1


def test_a_bulk_delete_in_the_admin_is_audited_row_by_row(root, tenant_a, tenant_b):
    quotas = [QuotaFactory(tenant=t, device_class="cpu") for t in (tenant_a, tenant_b)]
    client = Client()
    client.force_login(root)
    response = client.post("/admin/fleet/quota/", {
        "action": "delete_selected", "_selected_action": [q.pk for q in quotas], "post": "yes"})

    assert response.status_code == 302
    assert not Quota.objects.exists()
    deleted = AuditEvent.objects.filter(verb="deleted", object_type="fleet.quota").order_by("object_id")
    assert [(e.object_id, e.tenant_id, e.actor_label) for e in deleted] == [
        (str(q.pk), q.tenant_id, "root") for q in quotas]


def test_a_client_that_asks_for_csv_gets_the_stream_and_a_refusal_in_json(alice, month):
    api = APIClient()
    api.force_authenticate(alice)
    ok = api.get("/api/v1/audit-events/export/", {"as": "csv"}, HTTP_ACCEPT="text/csv")
    refused = api.get("/api/v1/audit-events/export/", {"as": "csv", "since": "soon"},
                      HTTP_ACCEPT="text/csv")
    assert ok.status_code == 200 and body(ok).startswith("id,created_at,tenant,actor,")
    assert refused.status_code == 400 and refused["Content-Type"] == "application/json"
    assert list(refused.json()) == ["since"]
