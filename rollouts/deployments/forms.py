"""Console forms. Each shapes its input, then ``save()`` calls the domain function the API calls,
so both faces refuse the same input with the same message on the same field. Their
``perform()`` returns the message to show the user (``console.forms.DomainForm``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from django import forms

from console.exceptions import Conflict, DomainError
from console.forms import DomainForm
from fleet.tenancy import namespaces
from rollouts.benchmarks import jobs as benchmark_jobs
from rollouts.benchmarks import results as benchmark_results
from rollouts.canary import requests as rollout_domain
from rollouts.deployments import lifecycle as deployments
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, Deployment, ModelVersion, Rollout, Route
from rollouts.registry import approvals
from rollouts.traffic import routes
from rollouts.workloads import requests as workloads


class VersionActionForm(DomainForm):
    """Request approval, approve, reject or archive a version, with the reason recorded."""

    ACTIONS: dict[str, tuple[Callable[..., ModelVersion], str]] = {
        "request-approval": (approvals.request_approval, "Approval requested for {v}."),
        "approve": (approvals.approve, "{v} approved."),
        "reject": (approvals.reject, "{v} rejected."),
        "archive": (approvals.archive, "{v} archived."),
    }

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)

    def __init__(self, *args: Any, version: ModelVersion, action: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.version = version
        self.action = action

    def perform(self) -> str:
        fn, done = self.ACTIONS[self.action]
        fn(self.actor, self.version, self.cleaned_data["reason"].strip())
        return done.format(v=f"{self.version.model.name} v{self.version.version}")


class DeploymentLoadForm(DomainForm):
    """Load a version of the deployment's model onto its servers, or unload it."""

    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        error_messages={
            "required": "choose a version to load",
            "invalid_choice": "not a version of this deployment's model",
        },
    )
    action = forms.ChoiceField(choices=[("load", "Load"), ("unload", "Unload")], required=False)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        self.fields["version"].queryset = deployment.model.versions.all()

    def clean_action(self) -> str:
        return self.cleaned_data.get("action") or "load"

    def perform(self) -> str:
        version = self.cleaned_data["version"]
        if self.cleaned_data["action"] == "unload":
            rows = loads.request_unload(self.actor, self.deployment, version)
            if not rows:
                return f"v{version.version} was not loaded."
            return f"Unloading v{version.version} from {_servers(len(rows))}."
        rows, created = loads.request_load(self.actor, self.deployment, version)
        if not created:
            return f"v{version.version} is already ready."
        return f"Loading v{version.version} onto {_servers(len(rows))}."


def _servers(count: int) -> str:
    return f"{count} server{'' if count == 1 else 's'}"


class DeploymentDeleteForm(DomainForm):
    """Delete a deployment: archived when it has load history, deleted when it has none."""

    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        outcome = deployments.delete_deployment(
            self.actor, self.deployment, self.cleaned_data["reason"].strip()
        )
        return f"Deployment {self.deployment.name} {outcome}."


class RouteForm(DomainForm):
    """Change a deployment's traffic split, routing policy and mirror (``routes.set_route``).

    One weight field per version ready on the deployment's servers (``weight_<n>``; left
    empty it is 0). The domain's refusals of the split as a whole land on ``weights``, those
    of the mirror on ``mirror``, and the router's on the form itself.
    """

    policy = forms.ChoiceField(choices=Route.Policy.choices, initial=Route.Policy.WEIGHTED)
    sticky_header = forms.CharField(
        required=False, max_length=64, label="Sticky header",
        help_text="The request header whose value keeps a client on its variant (sticky policy)",
    )
    mirror_version = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="Mirror to",
        error_messages={"invalid_choice": "not a version ready on the deployment's servers"},
    )
    mirror_percent = forms.IntegerField(required=False, min_value=0, max_value=100,
                                        label="Mirrored share (%)")
    reason = forms.CharField(required=False, max_length=2000, widget=forms.Textarea)
    # Where the domain's refusals of the split and of the mirror are shown.
    weights = forms.Field(required=False, widget=forms.HiddenInput, label="Weights")
    mirror = forms.Field(required=False, widget=forms.HiddenInput, label="Mirror")

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        route = Route.objects.filter(pk=deployment.pk).first()
        self.versions = sorted({load.version.version for load in routes.ready_loads(deployment)})
        in_force = route.version_weights if route is not None else {}
        for number in self.versions:
            self.fields[f"weight_{number}"] = forms.IntegerField(
                required=False, min_value=0, max_value=100, label=f"v{number}",
                initial=in_force.get(number, 0),
            )
        self.fields["mirror_version"].choices = [("", "no mirror")] + [
            (n, f"v{n}") for n in self.versions
        ]
        if route is not None and route.spec:
            self.fields["policy"].initial = route.policy
            self.fields["sticky_header"].initial = route.sticky_header
            target = route.variants.get(route.mirror_variant) or {}
            self.fields["mirror_version"].initial = target.get("version")
            self.fields["mirror_percent"].initial = route.mirror_percent or None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if data.get("mirror_percent") and data.get("mirror_version") is None:
            self.add_error("mirror_version", "choose the version to mirror to")
        return data

    def weight_fields(self) -> list[forms.BoundField]:
        return [self[f"weight_{n}"] for n in self.versions]

    def perform(self) -> str:
        data = self.cleaned_data
        weights = {n: data.get(f"weight_{n}") or 0 for n in self.versions}
        mirror = None
        if data["mirror_version"] is not None:
            mirror = routes.MirrorTarget(data["mirror_version"], data["mirror_percent"] or 0)
        route = routes.set_route(
            self.actor, self.deployment, weights, policy=data["policy"],
            # The header field keeps the sticky header in force; it means nothing to the others.
            sticky_header=data["sticky_header"].strip() if data["policy"] == Route.Policy.STICKY
            else "",
            mirror=mirror,
            reason=data["reason"].strip(),
        )
        split = ", ".join(f"v{n} {w}%" for n, w in route.version_weights.items() if w)
        return f"Traffic of {self.deployment.name}: {split} ({route.get_policy_display().lower()})."


class RouteDefaultForm(DomainForm):
    """Give a deployment its default route (``routes.ensure_route``)."""

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        route, made = routes.ensure_route(self.actor, self.deployment)
        if not made:
            return f"{self.deployment.name} already has a route."
        shares = route.version_weights
        return f"{self.deployment.name} routes all traffic to v{max(shares, key=shares.get)}."


class RouteRemoveForm(DomainForm):
    """Take a deployment's route off the router (``routes.remove_route``)."""

    reason = forms.CharField(required=False, max_length=2000)

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment

    def perform(self) -> str:
        routes.remove_route(self.actor, self.deployment, self.cleaned_data["reason"].strip())
        return f"{self.deployment.name}'s route is removed: its URL no longer answers."


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
                        "approval")
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
        self.fields["steps"].initial = json.dumps(rollout_domain.DEFAULT_STEPS)
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
                        "steps": data["steps"]}
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
        field = exc.field or ""
        base = re.split(r"[.\[]", field, maxsplit=1)[0]
        if base == "analysis_settings":
            base = "analysis"
        if base not in self.fields or base == field:
            return exc
        return type(exc)(f"{field}: {exc.message}", field=base)


def loads_versions(deployment: Deployment) -> list[int]:
    """Version numbers a rollout of the deployment may bring in (as the load form offers)."""
    versions = deployment.model.versions.exclude(
        status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED])
    if deployment.production:
        versions = versions.filter(status=ModelVersion.Status.APPROVED)
    return sorted(versions.values_list("version", flat=True))


def _even_split(numbers: list[int]) -> list[tuple[int, int]]:
    if len(numbers) < 2:
        return [(n, 50) for n in numbers]
    return [(numbers[0], 50), (numbers[1], 50)]


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
    (``benchmarks.jobs.create_job``): the levels as comma-separated concurrencies or request
    rates, seconds per level and of warm-up, an optional p99 SLO of its own, and optionally
    the Triton instance counts to compare (a config sweep: ``1,2`` measures one config with
    one instance, then one with two).

    The domain's refusals land on the field that holds the input (``slo.p99_ms`` on the SLO
    field, ``configs[1].instance_group`` on the instance counts, the path leading the
    message); those of the quota or of the deployment on the form itself.
    """

    FIELD_OF = {"slo": "slo_p99_ms", "configs": "instance_counts"}

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
        field = exc.field or ""
        base = re.split(r"[.\[]", field, maxsplit=1)[0]
        target = self.FIELD_OF.get(base, base)
        if target not in self.fields or target == field:
            return exc
        return type(exc)(f"{field}: {exc.message}", field=target)


class BenchmarkActionForm(DomainForm):
    """Cancel a benchmark (``jobs.cancel``), or register one of the configs a config sweep
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


class WorkloadCreateForm(DomainForm):
    """Run a version of the deployment's model on its Kubernetes cluster
    (``workloads.create_workload``): the GPU product and resource say whose quota it uses."""

    name = forms.CharField(max_length=63, help_text="Deployment, Service and server name")
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(),
        error_messages={"required": "choose a version",
                        "invalid_choice": "not a version of this deployment's model"},
    )
    replicas = forms.IntegerField(
        required=False, min_value=1, max_value=workloads.MAX_REPLICAS,
        help_text="a fixed count (empty: 1); leave it empty for an autoscaled server",
    )
    min_replicas = forms.IntegerField(
        required=False, min_value=1, max_value=workloads.MAX_REPLICAS, label="Min replicas (HPA)",
        help_text="with a max: autoscaled by an HPA, chosen now for good",
    )
    max_replicas = forms.IntegerField(
        required=False, min_value=1, max_value=workloads.MAX_REPLICAS, label="Max replicas (HPA)",
        help_text="the quota is held for this many",
    )
    gpu_resource = forms.CharField(max_length=100, initial="nvidia.com/gpu", label="GPU resource",
                                   help_text="nvidia.com/gpu, or a MIG slice such as "
                                             "nvidia.com/mig-3g.40gb")
    gpu_product = forms.CharField(max_length=63, label="GPU product",
                                  help_text="the nodes' nvidia.com/gpu.product label, e.g. "
                                            "NVIDIA-A100-SXM4-80GB")
    node_labels = forms.CharField(required=False, label="More node labels",
                                  widget=forms.Textarea(attrs={"rows": 2}),
                                  help_text="key=value, one a line")
    namespace = forms.CharField(required=False, max_length=63)
    model_repository = forms.CharField(required=False, max_length=500,
                                       help_text="s3://bucket/prefix, or a volume's mount path")
    volume_claim = forms.CharField(required=False, max_length=253,
                                   label="PersistentVolumeClaim")
    image = forms.CharField(required=False, max_length=300,
                            help_text="empty: the site's Triton or vLLM image")

    def __init__(self, *args: Any, deployment: Deployment, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment = deployment
        versions = deployment.model.versions.exclude(
            status__in=[ModelVersion.Status.REJECTED, ModelVersion.Status.ARCHIVED])
        if deployment.production:
            versions = versions.filter(status=ModelVersion.Status.APPROVED)
        self.fields["version"].queryset = versions.exclude(adapter_of__gt="")
        granted = namespaces.granted(deployment.tenant, deployment.cluster)
        self.fields["namespace"].widget.attrs["placeholder"] = granted[0] if granted else ""
        self.fields["namespace"].help_text = (
            f"granted: {', '.join(granted)}" if granted
            else "none granted yet: a platform admin grants namespaces")

    def clean_node_labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for number, line in enumerate(self.cleaned_data["node_labels"].splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.strip().partition("=")
            if not sep or not key.strip():
                raise forms.ValidationError(f"line {number}: write key=value")
            labels[key.strip()] = value.strip()
        return labels

    def perform(self) -> str:
        data = self.cleaned_data
        selector = {**data["node_labels"], "nvidia.com/gpu.product": data["gpu_product"].strip()}
        try:
            made, _ = workloads.create_workload(
                self.deployment, data["version"], self.actor, name=data["name"].strip(),
                replicas=data["replicas"], min_replicas=data["min_replicas"],
                max_replicas=data["max_replicas"], namespace=data["namespace"].strip(),
                gpu_resource=data["gpu_resource"].strip(), node_selector=selector,
                model_repository=data["model_repository"].strip(),
                volume_claim=data["volume_claim"].strip(), image=data["image"].strip(),
            )
        except DomainError as exc:
            if exc.field == "node_selector":  # the product and the labels are typed in here
                raise type(exc)(exc.message, field="node_labels") from exc
            raise
        if made.autoscaled:
            return (f"Server {made.name} asked for, autoscaled {made.min_replicas}-"
                    f"{made.max_replicas} by an HPA: quota admitted for {made.max_replicas} "
                    "replicas, applying it to the cluster.")
        return f"Server {made.name} asked for: quota admitted, applying it to the cluster."


class WorkloadActionForm(DomainForm):
    """Scale a server on Kubernetes (``workloads.scale``; an autoscaled one's HPA range,
    ``workloads.set_replica_range``), roll a vLLM server to another base-model version
    (``workloads.roll_version``), or delete it (``workloads.delete_workload``)."""

    ACTIONS = ("scale", "roll", "delete")

    replicas = forms.IntegerField(required=False, min_value=0, max_value=workloads.MAX_REPLICAS)
    min_replicas = forms.IntegerField(required=False, min_value=1,
                                      max_value=workloads.MAX_REPLICAS)
    max_replicas = forms.IntegerField(required=False, min_value=1,
                                      max_value=workloads.MAX_REPLICAS)
    version = forms.ModelChoiceField(
        queryset=ModelVersion.objects.none(), required=False,
        error_messages={"invalid_choice": "not a version of this deployment's model"},
    )
    # Where refusals about the workload itself (its state, the route's traffic) are shown.
    state = forms.Field(required=False, widget=forms.HiddenInput, label="Server")

    def __init__(self, *args: Any, workload: workloads.ServerWorkload, action: str,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.workload = workload
        self.action = action
        self.fields["version"].queryset = workload.deployment.model.versions.all()

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        ranged = data.get("min_replicas") is not None or data.get("max_replicas") is not None
        if (self.action == "scale" and data.get("replicas") is None and not ranged
                and not {"replicas", "min_replicas", "max_replicas"} & set(self.errors)):
            self.add_error("replicas", "give the number of replicas")
        if self.action == "scale" and data.get("replicas") is not None and ranged:
            self.add_error("replicas", "give replicas (a fixed count), or min and max replicas "
                                       "(an autoscaled server), not both")
        if self.action == "roll" and data.get("version") is None and "version" not in self.errors:
            self.add_error("version", "choose a version")
        return data

    def perform(self) -> str:
        name = self.workload.name
        if self.action == "scale" and self.cleaned_data["replicas"] is None:
            low, high = self.cleaned_data["min_replicas"], self.cleaned_data["max_replicas"]
            _, changed = workloads.set_replica_range(self.workload, low, high, self.actor)
            return (f"Changing {name}'s HPA range to {low}-{high} replicas." if changed
                    else f"{name}'s HPA scales within {low}-{high} replicas already.")
        if self.action == "scale":
            replicas = self.cleaned_data["replicas"]
            _, changed = workloads.scale(self.workload, replicas, self.actor)
            return (f"Scaling {name} to {replicas} replicas." if changed
                    else f"{name} runs {replicas} replicas already.")
        if self.action == "roll":
            version = self.cleaned_data["version"]
            _, changed = workloads.roll_version(self.workload, version, self.actor)
            return (f"Rolling {name} to v{version.version}." if changed
                    else f"{name} runs v{version.version} already.")
        _, started = workloads.delete_workload(self.workload, self.actor)
        return f"Deleting {name}." if started else f"{name} is being deleted already."
