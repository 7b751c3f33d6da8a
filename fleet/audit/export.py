"""Taking the audit log out of Switchyard, and how long it is kept.

An export is streamed: rows are read from the database in chunks (``iterator``) and written
out line by line, so a year of events never sits in memory. CSV for spreadsheets (``before``,
``after`` as JSON in their cells), JSON Lines for log pipelines (one event a line, as the API
answers it). Retention (``SWITCHYARD_AUDIT_RETENTION_DAYS``, 0: forever) deletes what is older
and records that it did, as a platform event, so the log says what left it and when.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.http import StreamingHttpResponse
from django.utils import timezone

from fleet import audit
from fleet.models import AuditEvent

FORMATS = {"csv": "text/csv; charset=utf-8", "jsonl": "application/x-ndjson"}
COLUMNS = ["id", "created_at", "tenant", "actor", "verb", "object_type", "object_id", "object",
           "before", "after", "reason"]
CHUNK = 2000


def row(event: AuditEvent) -> dict[str, Any]:
    """One event as an export writes it."""
    return {
        "id": event.pk, "created_at": event.created_at.isoformat(),
        "tenant": event.tenant.slug if event.tenant_id else None, "actor": event.actor_label,
        "verb": event.verb, "object_type": event.object_type, "object_id": event.object_id,
        "object": event.object_repr, "before": event.before, "after": event.after,
        "reason": event.reason,
    }


def _events(events: QuerySet[AuditEvent]) -> Iterator[AuditEvent]:
    return events.select_related("tenant").order_by("created_at", "id").iterator(chunk_size=CHUNK)


class _Line:
    """A file-like object that hands back what csv writes to it."""

    def write(self, text: str) -> str:
        return text


def csv_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """The events, oldest first, as CSV: a header, then a line each. A cell that a
    spreadsheet would run as a formula (=, +, -, @ first) is quoted with a leading '."""
    writer = csv.writer(_Line())
    yield writer.writerow(COLUMNS)
    for event in _events(events):
        values = row(event)
        yield writer.writerow([_cell(values[c]) for c in COLUMNS])


def _cell(value: Any) -> Any:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@"):
        return "'" + value
    return value


def jsonl_lines(events: QuerySet[AuditEvent]) -> Iterator[str]:
    """The events, oldest first, one JSON object a line."""
    for event in _events(events):
        yield json.dumps(row(event), sort_keys=True) + "\n"


def lines(events: QuerySet[AuditEvent], kind: str) -> Iterator[str]:
    return csv_lines(events) if kind == "csv" else jsonl_lines(events)


def response(events: QuerySet[AuditEvent], kind: str) -> StreamingHttpResponse:
    """A download of ``events`` as ``kind`` (csv or jsonl), streamed."""
    answer = StreamingHttpResponse(lines(events, kind), content_type=FORMATS[kind])
    name = f"switchyard-audit-{timezone.now():%Y%m%d-%H%M%S}.{kind}"
    answer["Content-Disposition"] = f'attachment; filename="{name}"'
    return answer


def prune(days: int | None = None) -> int:
    """Delete events older than the retention (days; 0 keeps everything). The deletion is
    itself recorded, with how many and up to when."""
    days = settings.SWITCHYARD_AUDIT_RETENTION_DAYS if days is None else days
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = AuditEvent.objects.filter(created_at__lt=cutoff).delete()
    if deleted:
        AuditEvent.objects.create(
            actor_label=audit.actor_label(None), verb="pruned", object_type="fleet.auditevent",
            object_id="", object_repr="audit log", after={"deleted": deleted, "before": cutoff.isoformat()},
            reason=f"retention: events are kept {days} day{'s' if days != 1 else ''}",
        )
    return deleted
