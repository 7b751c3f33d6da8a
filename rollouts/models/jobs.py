"""What every job row has: who asked for it, and the lease its reconciler advances it under.

Model loads, rollouts, benchmark jobs and server workloads are jobs: a person or a token asks
for one, and a reconciler that Celery calls for the row's id claims it with a short lease,
does one step and releases it (``rollouts/leases.py``, the one lease module, reads and writes
the lease fields). The jobs an API request creates idempotently also keep the request's
Idempotency-Key and a fingerprint of the request.
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models

from fleet.models import APIToken


class LeasedJob(models.Model):
    """A job someone asked for, advanced one step at a time under a lease."""

    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The person who asked for it (empty when a token or the system did)",
    )
    requested_by_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The API token it was asked for with",
    )
    requested_by_label = models.CharField(
        max_length=200,
        help_text="Who asked, as the audit log names them: a username, token:<name>@<team>, "
                  "or system",
    )
    lease_owner = models.CharField(
        max_length=64, blank=True,
        help_text="The reconciler step that holds the lease (a random id; empty: none)",
    )
    lease_expires_at = models.DateTimeField(
        null=True, blank=True, help_text="When the lease runs out unless its holder renews it",
    )

    # Not a column: True on the row that leases.claim returns when it took over a lease that
    # ran out (a worker died holding it).
    taken_over: bool = False

    class Meta:
        abstract = True

    def lease_held(self, now: datetime) -> bool:
        """Whether a lease on the row is held (by anyone) at ``now``."""
        return bool(self.lease_owner and self.lease_expires_at and self.lease_expires_at > now)


class IdempotentJob(LeasedJob):
    """A job that an API request creates idempotently: the same Idempotency-Key, sent again
    with the same request, answers with the same row."""

    idempotency_key = models.CharField(
        max_length=200, blank=True,
        help_text="The Idempotency-Key of the request that created it (empty: none)",
    )
    request_fingerprint = models.CharField(
        max_length=64, blank=True,
        help_text="A hash of that request: the key answers again only the same request",
    )

    class Meta(LeasedJob.Meta):
        abstract = True
