"""Traffic routes: how a deployment's requests are split between its versions and servers."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models

from fleet.models import APIToken
from fleet.tenancy.scoping import scoped_manager

from .deployments import Deployment


class Route(models.Model):
    """The route of one deployment: the client URL in front of its variants, and the split.

    A variant is a version on a server (``v<version>-<server>``). ``spec`` is the route in
    force on the cluster's traffic router (``fleet.adapters.routers.base.RouteSpec`` as JSON, empty
    before the first change was put in force), ``variants`` maps each variant name to the
    version and server it stands for, so per-request samples map back to them. ``policy``,
    ``sticky_header`` and the mirror repeat the spec's for queries and display.

    State: pending (no change settled yet: the first is being applied, or was interrupted)
    → in_force (the last change is what the router serves) | failed (the router refused the
    last change: ``error`` holds its message and ``spec`` is still the route before it, which
    the router keeps serving) | removed (taken off the router: clients of the URL get no
    answer, ``spec`` is empty; the row keeps the history, and a new change routes again).
    Each change is a :class:`RouteRevision`. ``claimed_until`` is set while a change is being
    applied, so two changes of one route never interleave.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        IN_FORCE = "in_force", "In force"
        FAILED = "failed", "Last change failed"
        REMOVED = "removed", "Removed"

    class Policy(models.TextChoices):
        WEIGHTED = "weighted", "Weighted random"
        LEAST_PENDING = "least-pending", "Least pending requests"
        STICKY = "sticky", "Sticky by header"

    deployment = models.OneToOneField(
        Deployment, primary_key=True, on_delete=models.CASCADE, related_name="route",
        help_text="The deployment the route serves: a route's id is its deployment's",
    )
    name = models.CharField(max_length=63, help_text="The route's name on the router: dep-<id>")
    protocol = models.CharField(
        max_length=16, blank=True, help_text="kserve-v2 (Triton) or openai (vLLM)"
    )
    policy = models.CharField(max_length=16, choices=Policy.choices, default=Policy.WEIGHTED)
    sticky_header = models.CharField(max_length=64, blank=True)
    mirror_variant = models.CharField(max_length=63, blank=True)
    mirror_percent = models.PositiveSmallIntegerField(default=0)
    spec = models.JSONField(default=dict, blank=True)
    variants = models.JSONField(default=dict, blank=True)
    url = models.CharField(max_length=300, blank=True, help_text="The URL clients call")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    error = models.TextField(blank=True, help_text="The router's message on the last failure")
    revision = models.PositiveIntegerField(default=0, help_text="The revision in force (0: none)")
    applied_at = models.DateTimeField(null=True, blank=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = scoped_manager("deployment__tenant")

    class Meta:
        ordering = ["deployment_id"]

    def __str__(self) -> str:
        return f"route of {self.deployment}"

    @property
    def weights(self) -> dict[str, int]:
        """The weight of each variant in force, by name."""
        return {v["name"]: v["weight"] for v in self.spec.get("variants", [])}

    @property
    def version_weights(self) -> dict[int, int]:
        """The share of traffic of each version in force (its variants added up)."""
        shares: dict[int, int] = {}
        for name, weight in self.weights.items():
            version = (self.variants.get(name) or {}).get("version")
            if version is not None:
                shares[version] = shares.get(version, 0) + weight
        return dict(sorted(shares.items()))

    def split(self) -> list[dict[str, Any]]:
        """The variants in force with what they stand for, in the order of the spec."""
        rows = []
        for variant in self.spec.get("variants", []):
            meaning = self.variants.get(variant["name"]) or {}
            rows.append({
                "name": variant["name"],
                "weight": variant["weight"],
                "version": meaning.get("version"),
                "server": meaning.get("server", ""),
                "upstream": variant["upstream"],
                "model": variant.get("model", ""),
                "mirror": variant["name"] == self.mirror_variant and self.mirror_percent > 0,
            })
        return rows


class RouteRevision(models.Model):
    """One change of a route: what was asked, by whom and why, and what the router answered.

    ``spec`` and ``variants`` are the full route asked for (as on :class:`Route`);
    ``weights`` the shares asked for by version. Result: applied (put in force; ``changed``
    and ``reloaded`` say what the router did) or failed (refused: ``message`` is the router's
    own word, e.g. nginx's ``[emerg]`` line, and the route before it stayed in force). A
    revision with an empty ``spec`` took the route off the router.
    """

    class Result(models.TextChoices):
        APPLIED = "applied", "Applied"
        FAILED = "failed", "Failed"

    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    spec = models.JSONField(default=dict)
    variants = models.JSONField(default=dict)
    weights = models.JSONField(default=dict, help_text="Share of traffic asked for per version")
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_label = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    result = models.CharField(max_length=16, choices=Result.choices)
    changed = models.BooleanField(default=False)
    reloaded = models.BooleanField(default=False)
    message = models.TextField(blank=True)
    url = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("route__deployment__tenant")

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.UniqueConstraint(fields=["route", "number"], name="uniq_route_revision")
        ]

    def __str__(self) -> str:
        return f"{self.route} #{self.number} ({self.result})"

    @property
    def policy(self) -> str:
        return str(self.spec.get("policy", ""))

    @property
    def mirror(self) -> dict[str, Any] | None:
        mirror = self.spec.get("mirror")
        return mirror if isinstance(mirror, dict) else None
