"""Console forms for benchmarks: start one on a deployment's server, cancel it, register a config
a sweep measured as a new version. Each calls the domain function the API calls
(``rollouts.benchmarks.requests``, ``rollouts.benchmarks.results``), so both faces refuse the same
input with the same message on the same field (``console.forms.DomainForm``)."""

from __future__ import annotations

import re
from typing import Any

from django import forms

from console.exceptions import Conflict, DomainError
from console.forms import DomainForm
from rollouts.benchmarks import requests as benchmark_jobs
from rollouts.benchmarks import results as benchmark_results
from rollouts.loads.forms import loads_versions
from rollouts.models import BenchmarkJob, Deployment, ModelVersion


def _numbers(text: str, *, whole: bool) -> list[int | float]:
    """'1, 2,4' → [1, 2, 4]; a bad item is a ValidationError naming it."""
    out: list[int | float] = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        try:
            number = float(item)
        except ValueError:
            raise forms.ValidationError(
                f"{item!r} is not a number: give numbers separated by commas, e.g. 1, 2, 4"
            ) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise forms.ValidationError(f"{item!r} is not a number")
        if whole and number != int(number):
            raise forms.ValidationError(f"{item} is not a whole number")
        out.append(int(number) if number == int(number) else number)
    return out


class BenchmarkStartForm(DomainForm):
    """Start a benchmark of a version of the deployment's model on one of its servers
    (``benchmarks.requests.create_job``): the levels as comma-separated concurrencies or request
    rates, seconds per level and of warm-up, an optional p99 SLO of its own, and optionally
    the Triton instance counts to compare (a config sweep: ``1,2`` measures one config with
    one instance, then one with two).

    The domain's refusals land on the field that holds the input (``slo.p99_ms`` on the SLO
    field, ``configs[1].instance_group`` on the instance counts, the path leading the
    message); those of the quota or of the deployment on the form itself.
    """

    FIELD_OF = {"slo": "slo_p99_ms", "configs": "instance_counts"}
    error_id_prefix = "bench-"  # the deployment page's load form has a version field too

    version = forms.TypedChoiceField(
        coerce=int, label="Version",
        error_messages={"required": "choose a version to benchmark",
                        "invalid_choice": "not a version of this deployment's model"},
    )
    server = forms.ChoiceField(
        required=False, label="Server",
        error_messages={"invalid_choice": "not one of this deployment's servers"},
    )
    mode = forms.ChoiceField(choices=BenchmarkJob.Mode.choices, initial=BenchmarkJob.Mode.CONCURRENCY,
                             label="Load")
    levels = forms.CharField(
        max_length=500, label="Levels", initial="1, 2, 4, 8, 16",
        help_text="concurrencies (whole numbers) or request rates per second, comma-separated",
        error_messages={"required": "give at least one level, e.g. 1, 2, 4, 8"},
    )
    duration_s = forms.FloatField(label="Seconds per level", initial=10,
                                  error_messages={"required": "give the seconds each level runs",
                                                  "invalid": "a number of seconds"})
    warmup_s = forms.FloatField(label="Warm-up (s)", initial=2, required=False,
                                error_messages={"invalid": "a number of seconds"})
    slo_p99_ms = forms.FloatField(required=False, label="p99 SLO (ms)",
                                  error_messages={"invalid": "a number of milliseconds"})
    instance_counts = forms.CharField(
        required=False, max_length=200, label="Compare instance counts",
        help_text="optional, e.g. 1, 2: one config per count, each loaded, measured and "
                  "unloaded in turn (Triton)",
    )

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        numbers = loads_versions(deployment)
        self.fields["version"].choices = [("", "choose a version")] + [
            (n, f"v{n}") for n in reversed(numbers)]
        if numbers:
            self.fields["version"].initial = numbers[-1]
        servers = [s.name for s in deployment.servers.order_by("name")]
        self.fields["server"].choices = [(name, name) for name in servers]
        if len(servers) != 1:
            self.fields["server"].choices.insert(0, ("", "choose a server"))
        self.fields["slo_p99_ms"].help_text = (
            f"empty: the deployment's {deployment.slo_p99_ms} ms")

    def clean_levels(self) -> list[int | float]:
        whole = self.data.get("mode", BenchmarkJob.Mode.CONCURRENCY) == BenchmarkJob.Mode.CONCURRENCY
        found = _numbers(self.cleaned_data["levels"], whole=whole)
        if not found:
            raise forms.ValidationError("give at least one level, e.g. 1, 2, 4, 8")
        return found

    def clean_instance_counts(self) -> list[dict[str, Any]]:
        counts = _numbers(self.cleaned_data.get("instance_counts", ""), whole=True)
        return [{"instance_group": {"count": int(n)}} for n in counts]

    def perform(self) -> BenchmarkJob:
        data = self.cleaned_data
        slo = {"p99_ms": data["slo_p99_ms"]} if data.get("slo_p99_ms") is not None else None
        try:
            job, _ = benchmark_jobs.create_job(
                self.actor, self.deployment, version=data["version"],
                server=data.get("server") or None, mode=data["mode"], levels=data["levels"],
                duration_s=data["duration_s"],
                warmup_s=data["warmup_s"] if data.get("warmup_s") is not None else 0,
                slo=slo, configs=data["instance_counts"] or None,
            )
        except DomainError as exc:
            raise self._on_field(exc) from exc
        return job

    def _on_field(self, exc: DomainError) -> DomainError:
        def on_field(field: str | None, message: str) -> tuple[str | None, str]:
            base = re.split(r"[.\[]", field or "", maxsplit=1)[0]
            target = self.FIELD_OF.get(base, base)
            if target not in self.fields or target == field:
                return field, message
            return target, f"{field}: {message}"

        return exc.renamed(on_field)


class BenchmarkActionForm(DomainForm):
    """Cancel a benchmark (``requests.cancel``), or register one of the configs a config sweep
    measured as a new version (``results.register_config``).

    ``expected`` is the version number the button promised: when the model has moved on (or
    this config was registered already, a second click), the refusal says so rather than
    registering the same config twice.
    """

    ACTIONS = ("cancel", "register-config")

    config = forms.IntegerField(required=False, min_value=0, widget=forms.HiddenInput)
    expected = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)
    # Where the domain's refusals (a job already ended, nothing to register) are shown.
    job = forms.Field(required=False, widget=forms.HiddenInput, label="Benchmark")

    def __init__(self, *args: Any, job: BenchmarkJob, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job = job
        self.action = action

    def perform(self) -> str | ModelVersion:
        if self.action == "cancel":
            benchmark_jobs.cancel(self.actor, self.job)
            return f"Benchmark {self.job.pk}: cancel asked for; the load stops within a second."
        index = self.cleaned_data.get("config")
        chosen = (self.job.summary or {}).get("best_config") if index is None else index
        label = (self.job.results[chosen]["label"]
                 if chosen is not None and 0 <= chosen < len(self.job.results) else None)
        model = self.job.version.model
        if label is not None:
            earlier = model.versions.filter(labels__benchmark_job=str(self.job.pk),
                                            labels__benchmark_config=label).first()
            if earlier is not None:
                raise Conflict(f"{label} of benchmark {self.job.pk} is registered already, "
                               f"as v{earlier.version}", field="job")
        expected = self.cleaned_data.get("expected")
        top = model.versions.order_by("-version").values_list("version", flat=True).first() or 0
        if expected is not None and expected != top + 1:
            raise Conflict(f"{model.name} has v{top} now: the next version is v{top + 1}, not "
                           f"v{expected}; reload the page to check", field="job")
        return benchmark_results.register_config(self.actor, self.job, index)
