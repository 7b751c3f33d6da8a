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

    # Indexed by audit_tenant_newest, whose first column it is.
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit_events",
        db_index=False,
    )
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    verb = models.CharField(max_length=40)
    object_type = models.CharField(max_length=60)
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=300)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["-created_at", "-id"]
        # Ten million rows and more: every list reads a page in index order, newest first,
        # from where the last page ended (console.paging, console.pagination), never a sort.
        indexes = [
            # A platform admin's log, and the filters (verb, actor, …) read along it.
            models.Index(fields=["-created_at", "-id"], name="audit_newest"),
            # A tenant member's log (visible_to: tenant IN (…)); the action and object type
            # ride along, so the page's capped count under those filters reads only the index.
            models.Index(fields=["tenant", "-created_at", "-id"], include=["verb", "object_type"],
                         name="audit_tenant_newest"),
            # One object's history (a version's page; a workload's idempotent replay).
            models.Index(fields=["object_type", "object_id", "-created_at"], name="audit_object"),
        ]

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
