"""Console forms for rollouts: start a canary or an A/B split of a deployment, and pause, resume,
promote, abort, approve or retry one. Each calls the domain function the API calls
(``rollouts.canary.requests``), so both faces refuse the same input with the same message on the
same field (``console.forms.DomainForm``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django import forms

from console.exceptions import DomainError
from console.forms import DomainForm
from rollouts.canary import requests as rollout_domain
from rollouts.canary import specs as rollout_specs
from rollouts.loads.forms import loads_versions
from rollouts.models import Deployment, Rollout
from rollouts.traffic import routes


def _act(action: str) -> Callable[[Any, Rollout, str], Rollout]:
    def run(actor: Any, rollout: Rollout, reason: str) -> Rollout:
        return rollout_domain.request_action(actor, rollout, action, reason)

    return run


class RolloutActionForm(DomainForm):
    """Pause, resume, promote now, abort (``rollout.request_action``), approve
    (``rollout.approve``) or retry (``rollout.retry``) a rollout, with the reason recorded."""

    ACTIONS: dict[str, tuple[Callable[[Any, Rollout, str], Rollout], str]] = {
        "pause": (_act(Rollout.Action.PAUSE), "Pause asked for: {r} pauses at its next tick."),
        "resume": (_act(Rollout.Action.RESUME), "Resume asked for: {r} goes on at its next tick."),
        "promote": (_act(Rollout.Action.PROMOTE),
                    "Promotion asked for: {r} skips its remaining steps at its next tick."),
        "abort": (_act(Rollout.Action.ABORT),
                  "Abort asked for: {r} sends all traffic back to the baseline at its next tick."),
        "approve": (rollout_domain.approve, "{r} approved."),
        "retry": (rollout_domain.retry, "{r} starts again from its first step."),
    }

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)
    # Where the domain's refusals (wrong state, another action in flight) are shown.
    action = forms.Field(required=False, widget=forms.HiddenInput, label="Action")

    def __init__(self, *args: Any, rollout: Rollout, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rollout = rollout
        self.action_name = action

    def perform(self) -> str:
        fn, done = self.ACTIONS[self.action_name]
        fn(self.actor, self.rollout, self.cleaned_data["reason"].strip())
        return done.format(r=f"Rollout {self.rollout.pk}")


def _json_field(label: str, help_text: str) -> forms.CharField:
    return forms.CharField(required=False, max_length=20_000, label=label, help_text=help_text,
                           widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}))


class RolloutStartForm(DomainForm):
    """Start a rollout of a deployment (``rollout.create_rollout``): a canary (the version to
    bring in, an optional baseline, the steps and analysis settings as JSON, the alias that
    promotion moves) or an A/B split (the variants as JSON, how it ends, a sticky header).

    The domain names nested inputs (``steps[2]``, ``analysis.alpha``, ``variants[0].weight``);
    their refusals land on the field that holds them, the path leading the message.
    """

    JSON_FIELDS = ("steps", "analysis", "variants")

    strategy = forms.ChoiceField(choices=Rollout.Strategy.choices)
    version = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Version to roll out",
        error_messages={"invalid_choice": "not a version of this deployment's model"},
    )
    baseline = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Baseline",
        error_messages={"invalid_choice": "not a version ready on the deployment's servers"},
    )
    steps = _json_field("Steps (JSON)", "set_weight, pause ({} or {\"seconds\": N}), analysis, "
                        "approval, benchmark, shadow ({\"percent\": 100} first: copies "
                        "judged before anyone is served), confirm ({\"webhook\": NAME})")
    analysis = _json_field("Analysis settings (JSON, optional)",
                           "e.g. {\"min_samples\": 200, \"latency_tolerance_pct\": 5}; the "
                           "deployment's SLO is the default ceiling")
    alias = forms.CharField(required=False, max_length=64, label="Alias promotion moves",
                            help_text="empty: none")
    variants = _json_field("Variants (JSON)", "[{version, weight}], the reference first; the "
                           "weights sum to 100")
    duration_s = forms.IntegerField(required=False, label="Duration (s)")
    sample_size = forms.IntegerField(required=False, label="Or requests per variant")
    sticky_header = forms.CharField(required=False, max_length=64, label="Sticky header",
                                    help_text="keeps a client on its variant, e.g. X-User-Id")
    promote = forms.BooleanField(required=False, label="Promote a clear winner at the end")
    require_approval = forms.BooleanField(required=False,
                                          label="Wait for an approver before it starts")
    dry_run = forms.BooleanField(
        required=False, label="Dry run",
        help_text="each weight copies that share of the requests to the candidate and judges "
                  "the copies; no traffic moves, nothing is promoted")
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea(
        attrs={"rows": 2}))

    def __init__(self, *args: Any, deployment: Deployment, strategy: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.strategy_posted = self.data.get("strategy") if self.is_bound else strategy
        numbers = loads_versions(deployment)
        ready = sorted({load.version.version for load in routes.ready_loads(deployment)})
        self.fields["version"].choices = [("", "choose a version")] + [
            (n, f"v{n}") for n in numbers]
        self.fields["baseline"].choices = [("", "the version carrying the most traffic")] + [
            (n, f"v{n}") for n in ready]
        self.fields["strategy"].initial = strategy
        self.fields["steps"].initial = json.dumps(rollout_specs.DEFAULT_STEPS)
        self.fields["alias"].initial = routes.PRODUCTION_ALIAS if deployment.production else ""
        self.fields["variants"].initial = json.dumps(
            [{"version": n, "weight": w} for n, w in _even_split(ready[-2:])])
        self.fields["require_approval"].initial = deployment.production

    def _clean_json(self, name: str) -> Any:
        text = self.cleaned_data.get(name, "").strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from exc

    def clean_steps(self) -> Any:
        return self._clean_json("steps")

    def clean_analysis(self) -> Any:
        return self._clean_json("analysis")

    def clean_variants(self) -> Any:
        return self._clean_json("variants")

    def perform(self) -> Rollout:
        data = self.cleaned_data
        common = {
            "strategy": data["strategy"], "analysis_settings": data["analysis"],
            "alias": data["alias"].strip(), "reason": data["reason"].strip(),
            "require_approval": data["require_approval"],
        }
        if data["strategy"] == Rollout.Strategy.CANARY:
            specific = {"version": data["version"], "baseline": data["baseline"],
                        "steps": data["steps"], "dry_run": data["dry_run"]}
        else:
            specific = {"variants": data["variants"], "duration_s": data["duration_s"],
                        "sample_size": data["sample_size"],
                        "sticky_header": data["sticky_header"].strip(),
                        "promote": data["promote"]}
        try:
            made, _ = rollout_domain.create_rollout(self.actor, self.deployment, **common,
                                                    **specific)
        except DomainError as exc:
            raise self._on_field(exc) from exc
        return made

    def _on_field(self, exc: DomainError) -> DomainError:
        """The refusal of a nested input (``steps[2]``) on its field (``steps``), the path
        leading the message; those of the settings on ``analysis``."""
        def on_field(field: str | None, message: str) -> tuple[str | None, str]:
            base = re.split(r"[.\[]", field or "", maxsplit=1)[0]
            if base == "analysis_settings":
                base = "analysis"
            if base not in self.fields or base == field:
                return field, message
            return base, f"{field}: {message}"

        return exc.renamed(on_field)


def _even_split(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) < 2:
        return [(n, 50) for n in numbers]
    return [(numbers[0], 50), (numbers[1], 50)]
