"""One version everywhere: whether a deployment's servers agree on what they serve.

Every server of a deployment should serve the same versions of its model, each with the
same config (the same config hash). :func:`view` says, per server, which version it serves
with which config hash and in which state, and whether the servers disagree: a version
ready on one server and not on another (one still on v1, one on v2), or a version run with
another config on one of them (changed by hand, left by a benchmark's config override).
What it judges is what the loads record: a load writes the hash of the config it read back
from the server, and the drift check (``rollouts.loads.drift.check_configs``) records the
config a server runs now, for the servers of a deployment of several servers at every
health interval.

:func:`converge` makes them agree again, as one audited action: a version missing from a
server is loaded there (``rollouts.loads.requests.load_for``), and a version run with
several configs gets its own config sent again where it is ready
(``rollouts.loads.reloads.reload_for``: a no-op on a server that runs it already). It never
unloads: taking a version away is a rollout's or a person's decision. A deployment with
``auto_converge`` is converged by the reconcile tick (:func:`converge_due`), at most every
:data:`AUTO_CONVERGE_EVERY_S`.

Kubernetes workloads (servers Switchyard runs, which serve the version they were started
with) are shown and not judged: their versions change through their workload.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.audit import actor_label
from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import require_role
from rollouts.loads import reloads
from rollouts.loads import requests as loads
from rollouts.models import BenchmarkJob, Deployment, ModelLoad, ModelVersion, Rollout

log = logging.getLogger(__name__)
State = ModelLoad.State

#: Seconds between two convergences the reconcile tick starts for one deployment (one that
#: cannot converge, say over quota, is not asked again every tick).
AUTO_CONVERGE_EVERY_S = 30.0
#: A load of these states serves (or is on its way to, or from) the server.
SHOWN = [State.READY, *ModelLoad.IN_FLIGHT]
CONSISTENT, INCONSISTENT, CONVERGING = "consistent", "inconsistent", "converging"


@dataclass(frozen=True)
class Entry:
    """A load of the deployment on one of its servers, as plain values."""

    server_id: int
    version: int
    state: str
    config_hash: str
    load_id: int | None = None
    #: Ready, or reloading (a version being sent its config again still serves meanwhile).
    serving: bool = False


def entry(server_id: int, version: int, state: str, config_hash: str, ready_at: Any,
          load_id: int | None = None) -> Entry:
    serving = state == State.READY or (state == State.LOADING and ready_at is not None)
    return Entry(server_id, version, state, config_hash, load_id, serving)


@dataclass
class Row:
    """One line of the per-server view: a version on a server (``version`` None: the server
    serves nothing of the model), and whether it disagrees with the other servers."""

    server: InferenceServer
    version: int | None
    state: str
    config_hash: str = ""
    load_id: int | None = None
    judged: bool = True
    disagrees: bool = False
    why: str = ""

    @property
    def config_short(self) -> str:
        return self.config_hash[:12]


@dataclass
class Judgement:
    """What the servers' loads say: the disagreements in words, the versions missing from
    servers and the versions run with several configs (version -> server ids)."""

    reasons: list[str] = field(default_factory=list)
    missing: dict[int, list[int]] = field(default_factory=dict)
    mixed: dict[int, list[int]] = field(default_factory=dict)
    odd: dict[tuple[int, int], str] = field(default_factory=dict)  # (server, version) -> why
    majority: dict[int, str] = field(default_factory=dict)  # version -> hash most servers run
    in_flight: bool = False

    @property
    def consistent(self) -> bool:
        return not self.reasons

    @property
    def state(self) -> str:
        if self.in_flight:
            return CONVERGING if self.reasons else CONSISTENT
        return INCONSISTENT if self.reasons else CONSISTENT


def judge(servers: dict[int, str], entries: Iterable[Entry]) -> Judgement:
    """Judge the loads ``entries`` on the judged ``servers`` (id -> name).

    Each version ready on a server (or reloading there) should be ready on every server; each version ready on
    several servers should run with one config hash there. A hash not run by most of them
    disagrees (with as many on each side, every one of them does).
    """
    found = Judgement()
    ready: dict[int, dict[int, str]] = defaultdict(dict)  # version -> server id -> hash
    for entry in entries:
        if entry.server_id not in servers:
            continue
        if entry.serving:
            ready[entry.version][entry.server_id] = entry.config_hash
        if entry.state in ModelLoad.IN_FLIGHT:
            found.in_flight = True
    for version in sorted(ready):
        on = ready[version]
        absent = sorted(set(servers) - set(on), key=lambda pk: servers[pk])
        if absent:
            found.missing[version] = absent
            names = ", ".join(servers[pk] for pk in absent)
            found.reasons.append(f"v{version} is not ready on {names} (it is on "
                                 f"{', '.join(sorted(servers[pk] for pk in on))})")
            for pk in absent:
                found.odd[(pk, version)] = f"v{version} is ready on the other servers"
        counts = Counter(on.values())
        top = counts.most_common()
        if len(top) > 1:
            found.mixed[version] = sorted(on, key=lambda pk: servers[pk])
            tie = top[0][1] == top[1][1]
            if not tie:
                found.majority[version] = top[0][0]
            shown = ", ".join(f"{servers[pk]} {h[:12] or 'unknown'}" for pk, h in
                              sorted(on.items(), key=lambda item: servers[item[0]]))
            found.reasons.append(f"v{version} runs with {len(top)} configs: {shown}")
            for pk, hash_ in on.items():
                if tie or hash_ != top[0][0]:
                    found.odd[(pk, version)] = (
                        f"another config than {'the other servers' if not tie else 'another server'}"
                        f" ({hash_[:12] or 'unknown'})")
    return found


def _judged(servers: Iterable[InferenceServer]) -> dict[int, str]:
    return {s.pk: s.name for s in servers if s.source != InferenceServer.Source.MANAGED}


@dataclass
class View:
    """A deployment's consistency: :func:`judge`'s judgement and the per-server rows."""

    deployment: Deployment
    judgement: Judgement
    rows: list[Row]

    @property
    def consistent(self) -> bool:
        return self.judgement.consistent

    @property
    def state(self) -> str:
        return self.judgement.state

    @property
    def reasons(self) -> list[str]:
        return self.judgement.reasons


def view(deployment: Deployment) -> View:
    """Per server of the deployment: each version of its model loaded there (ready or on its
    way), its config hash and state, the versions missing there; and the judgement."""
    servers = list(deployment.servers.order_by("name"))
    judged = _judged(servers)
    shown = list(
        ModelLoad.objects.filter(deployment=deployment, server__in=servers, state__in=SHOWN)
        .values("pk", "server_id", "version__version", "state", "config_hash", "ready_at")
        .order_by("server__name", "version__version", "-pk")
    )
    entries, seen = [], set()
    for row in shown:
        key = (row["server_id"], row["version__version"])
        if key in seen:  # an unload in flight beside a newer load: the newest speaks
            continue
        seen.add(key)
        entries.append(entry(row["server_id"], row["version__version"], row["state"],
                             row["config_hash"], row["ready_at"], row["pk"]))
    found = judge(judged, entries)
    rows: list[Row] = []
    by_server: dict[int, list[Entry]] = defaultdict(list)
    for item in entries:
        by_server[item.server_id].append(item)
    for server in servers:
        mine = [Row(server, e.version, e.state, e.config_hash, e.load_id,
                    judged=server.pk in judged) for e in by_server[server.pk]]
        mine += [Row(server, version, "missing", judged=True)
                 for version, absent in found.missing.items() if server.pk in absent]
        for row in mine:
            why = found.odd.get((server.pk, row.version or 0), "")
            row.disagrees, row.why = bool(why), why
        mine.sort(key=lambda r: r.version or 0)
        rows.extend(mine or [Row(server, None, "nothing loaded", judged=server.pk in judged)])
    return View(deployment, found, rows)


def states_of(deployments: list[Deployment]) -> dict[int, str]:
    """Deployment id -> consistent, inconsistent or converging, for a list of deployments in
    two queries (their servers, their loads)."""
    ids = [d.pk for d in deployments]
    if not ids:
        return {}
    through = Deployment.servers.through
    servers: dict[int, dict[int, str]] = defaultdict(dict)
    for deployment_id, server_id, name, source in through.objects.filter(
            deployment_id__in=ids).values_list("deployment_id", "inferenceserver_id",
                                              "inferenceserver__name", "inferenceserver__source"):
        if source != InferenceServer.Source.MANAGED:
            servers[deployment_id][server_id] = name
    entries: dict[int, list[Entry]] = defaultdict(list)
    newest: set[tuple[int, int, int]] = set()
    for deployment_id, server_id, version, state, hash_, ready_at in (
            ModelLoad.objects.filter(deployment_id__in=ids, state__in=SHOWN)
            .order_by("-pk").values_list("deployment_id", "server_id", "version__version",
                                         "state", "config_hash", "ready_at")):
        if (deployment_id, server_id, version) in newest:
            continue
        newest.add((deployment_id, server_id, version))
        entries[deployment_id].append(entry(server_id, version, state, hash_, ready_at))
    return {pk: judge(servers[pk], entries[pk]).state for pk in ids}


# --------------------------------------------------------------------------------------------
# Converging
# --------------------------------------------------------------------------------------------


@dataclass
class Convergence:
    """What :func:`converge` started: loads of missing versions and reloads of configs."""

    deployment: Deployment
    reasons: list[str]
    loads: list[ModelLoad]
    reloads: list[ModelLoad]


def blocker(deployment: Deployment) -> str:
    """Why the deployment cannot be converged now ("" when it can): a rollout or a
    benchmark changing what it serves, or a load in flight on it."""
    if deployment.archived_at is not None:
        return f"deployment {deployment.name} is archived"
    rollout = deployment.rollouts.filter(state__in=Rollout.ACTIVE).first()
    if rollout is not None:
        return (f"rollout {rollout.pk} is changing what the deployment serves: converge once it "
                "has ended")
    job = deployment.benchmark_jobs.filter(state__in=BenchmarkJob.ACTIVE).first()
    if job is not None:
        return (f"benchmark {job.pk} is running on the deployment (with a config of its own): "
                "converge once it has ended")
    busy = (ModelLoad.objects.filter(deployment=deployment, state__in=ModelLoad.IN_FLIGHT)
            .select_related("version", "server").first())
    if busy is not None:
        return (f"{busy.get_state_display().lower()} of v{busy.version.version} is in flight on "
                f"{busy.server.name} (load {busy.pk}): wait for it to finish")
    return ""


def converge(actor: Any, deployment: Deployment, *, reason: str = "") -> Convergence:
    """Make the deployment's servers agree (deployer role; ``actor`` None: the system, for a
    deployment that asks for it). Loads each version missing from a server there, and sends
    the version's own config again wherever a version runs with several configs.

    A Conflict (409) when there is nothing to converge, or while a rollout, a benchmark or a
    load is changing what it serves; a load that cannot start (over quota, a version a
    production deployment may not load) is refused as the load would be, and nothing starts.
    """
    if actor is not None:
        require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    label = f"converge by {actor_label(actor)}"
    with transaction.atomic():
        # Two converges of one deployment go one at a time: the second sees the first's loads.
        locked = Deployment.objects.select_for_update().get(pk=deployment.pk)
        waiting = blocker(locked)
        if waiting:
            raise Conflict(f"cannot converge now: {waiting}", field="deployment")
        seen = view(locked)
        if seen.consistent:
            raise Conflict(f"deployment {deployment.name}'s servers agree: nothing to converge",
                           field="deployment")
        servers = {s.pk: s for s in locked.servers.all()}
        versions = {v.version: v for v in locked.model.versions.filter(
            version__in=[*seen.judgement.missing, *seen.judgement.mixed])}
        why = reason or "; ".join(seen.reasons)
        started: list[ModelLoad] = []
        reloaded: list[ModelLoad] = []
        for number, absent in sorted(seen.judgement.missing.items()):
            made, _new = loads.load_for(locked, versions[number],
                                        [servers[pk].name for pk in absent], label)
            started.extend(made)
        # A server that loads a missing version now gets the model's config with it (Triton
        # keeps one config per model): its other versions are not reloaded beside that load.
        loading = {load.server_id for load in started}
        for number, where in sorted(seen.judgement.mixed.items()):
            version = versions[number]
            where = [pk for pk in where if pk not in loading]
            if not where:
                continue
            if version.runtime != ModelVersion.Runtime.TRITON:
                raise DomainError(
                    f"v{number} runs with several configs, and a vLLM version's config is the "
                    "server's own: roll the servers to one config (a workload or a base-model "
                    "load)", field="deployment")
            reloaded.extend(reloads.reload_for(
                actor, locked, version, [servers[pk] for pk in where], label=label, why=why))
        Deployment.objects.filter(pk=locked.pk).update(converged_at=timezone.now())
        audit.record(actor, "converged", locked, tenant=locked.tenant,
                     before={"state": seen.state, "disagreements": seen.reasons},
                     after={"loads": [load.pk for load in started],
                            "reloads": [load.pk for load in reloaded]},
                     reason=why)
    log.info("deployment %s: converging (%s)", deployment.pk, why)
    return Convergence(locked, seen.reasons, started, reloaded)


def converge_due(now: Any = None) -> int:
    """The reconcile tick's part: converge every deployment with ``auto_converge`` whose
    servers disagree, that nothing else is changing, and that was not asked to converge in
    the last :data:`AUTO_CONVERGE_EVERY_S`. Returns how many it started converging."""
    now = now or timezone.now()
    due = list(Deployment.objects.filter(auto_converge=True, archived_at__isnull=True).exclude(
        converged_at__gt=now - timedelta(seconds=AUTO_CONVERGE_EVERY_S)).select_related(
        "tenant", "model"))
    started = 0
    for deployment, state in zip(due, states_of(due).values(), strict=True):
        if state != INCONSISTENT or blocker(deployment):
            continue
        try:
            converge(None, deployment, reason="the deployment converges by itself (auto_converge)")
            started += 1
        except DomainError as exc:
            # Recorded, so the next attempt waits its turn rather than failing every tick.
            Deployment.objects.filter(pk=deployment.pk).update(converged_at=now)
            audit.record(None, "converge_refused", deployment, tenant=deployment.tenant,
                         reason=exc.message)
            log.warning("deployment %s: cannot converge: %s", deployment.pk, exc.message)
        except Exception:  # one deployment must not stop the others
            log.exception("converging deployment %s failed", deployment.pk)
    return started
