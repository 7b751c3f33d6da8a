"""The audit log: every change, with who, when, what and why."""

from __future__ import annotations

import re

from django.conf import settings
from django.db import models

from fleet.tenancy.scoping import scoped_manager

from .tenancy import APIToken, Tenant

# Loads, placements and server workloads were once named with their state at the time of the
# event ("acme/fraud v2 on triton-1 (pending)"); shown later, that reads as their state now.
NAMED_WITH_STATE = {"rollouts.modelload", "fleet.placement", "rollouts.serverworkload"}
STATE_SUFFIX = re.compile(r"(?P<name>.+) \((?P<state>[a-z_]+)\)")


class AuditEvent(models.Model):
    """One recorded change. Append-only: nothing updates or deletes these rows.

    ``actor_label`` keeps a readable name even after the user or token is gone; ``before``
    and ``after`` hold the changed fields; ``reason`` is what the actor gave as the why.
    ``tenant`` is empty for platform-level changes (clusters, servers).
    """

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events"
    )
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    verb = models.CharField(max_length=40, db_index=True)
    object_type = models.CharField(max_length=60, db_index=True)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=300)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="audit_tenant_time")]

    def __str__(self) -> str:
        return f"{self.actor_label} {self.verb} {self.object_repr}"

    @property
    def object_label(self) -> str:
        """The object's name as recorded; a state recorded in it is said to be the state then
        ("… on triton-1 (was pending)")."""
        if self.object_type in NAMED_WITH_STATE:
            match = STATE_SUFFIX.fullmatch(self.object_repr)
            if match:
                return f"{match['name']} (was {match['state'].replace('_', ' ')})"
        return self.object_repr
