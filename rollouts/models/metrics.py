"""Metric templates: PromQL queries platform admins write once, that analyses use as extra
gates (``analysis.metrics``), as Flagger's MetricTemplate and Argo Rollouts' AnalysisTemplate
do. A tenant names a template and a range; it never writes PromQL itself, so a query can only
read what its template reads, with the rollout's own names put in
(:mod:`rollouts.canary.metrics`)."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models

# The names a template's query may use, filled in from the rollout being judged: ``tenant``
# (its slug), ``deployment`` (name), ``deployment_id``, ``route`` (the route's name on the
# router, dep-<id>), ``model``, ``candidate`` and ``baseline`` (version numbers), ``interval``
# (the gate's window, e.g. 60s, for rate() and friends).
VARIABLES = ("tenant", "deployment", "deployment_id", "route", "model", "candidate", "baseline",
             "interval")
PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class MetricTemplate(models.Model):
    """A PromQL query with ``{{ name }}`` placeholders for the rollout's names
    (:data:`rollouts.canary.metrics.VARIABLES`), answering one number."""

    name = models.CharField(
        max_length=63, unique=True,
        validators=[RegexValidator(r"^[a-z0-9][a-z0-9-]{0,62}$",
                                   "lowercase letters, digits and -, starting with a letter "
                                   "or digit")],
        help_text="How analyses name it, e.g. gpu-memory-ratio")
    query = models.TextField(help_text="PromQL answering one number, e.g. "
                             "max(rate(errors_total{model=\"{{ model }}\"}[{{ interval }}]))")
    unit = models.CharField(max_length=20, blank=True, help_text="Shown beside its values")
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(self.query)} - set(VARIABLES))
        if unknown:
            raise ValidationError({"query": f"unknown placeholder {', '.join(unknown)}; known: "
                                            f"{', '.join(VARIABLES)}"})
