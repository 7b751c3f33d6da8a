"""Model loads: what people, the API and the system ask for.

:func:`request_load` / :func:`request_unload` (and :func:`load_for` / :func:`unload_for`, the
same for the system on someone's behalf) check the request, write the rows and hand each new
load to a worker by task name after the commit. Loading and unloading themselves (admit against
quota, fetch from S3, place, load, and the way back) are the reconciler's
(``rollouts.loads.reconciler``); what a load asks of its server is ``rollouts.loads.demand``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from console import logs
from console.celery import send_soon
from console.exceptions import Conflict, DomainError
from fleet import audit
from fleet.audit import actor_label
from fleet.models import InferenceServer, Membership
from fleet.tenancy.scoping import require_role, token_of
from rollouts import idempotency
from rollouts.loads.demand import is_lora
from rollouts.models import Deployment, ModelLoad, ModelLoadEvent, ModelVersion
from rollouts.slo import neighbours
from rollouts.traffic import routes

log = logging.getLogger(__name__)
State = ModelLoad.State
Status = ModelVersion.Status



def _servers(deployment: Deployment, names: list[str] | None) -> list[InferenceServer]:
    """The servers named, or the deployment's servers whose versions loads change (not the
    Kubernetes workloads', which run the version they were started with)."""
    servers = list(deployment.servers.order_by("name"))
    if not names:
        managed = [s for s in servers if s.source == InferenceServer.Source.MANAGED]
        servers = [s for s in servers if s.source != InferenceServer.Source.MANAGED]
        if managed and not servers:
            raise DomainError(
                f"deployment {deployment.name}'s servers are Kubernetes workloads, each running "
                "the version it was started with: run a workload of the version instead",
                field="servers",
            )
    if names:
        known = {s.name: s for s in servers}
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise DomainError(
                f"deployment {deployment.name} has no server named {', '.join(unknown)}",
                field="servers",
            )
        servers = [known[n] for n in sorted(set(names))]
    if not servers:
        raise DomainError(f"deployment {deployment.name} has no servers to load onto", field="servers")
    return servers


def _refuse_managed(server: InferenceServer, what: str) -> None:
    """A server Switchyard runs as a Kubernetes workload serves the version it was started
    with: what runs there changes through the workload (rollouts.workloads.requests), not loads."""
    if server.source != InferenceServer.Source.MANAGED:
        return
    where = f"{server.kube_namespace}/{server.kube_name}" if server.kube_name else server.name
    raise Conflict(
        f"{server.name} is run by the Kubernetes workload {where}, which serves the version "
        f"it was started with: cannot {what}; create a workload for another version, roll a "
        "vLLM workload to it, or delete the workload",
        field="servers",
    )


def check_runtime(version: ModelVersion, servers: list[InferenceServer]) -> None:
    wrong = [s.name for s in servers if s.runtime != version.runtime]
    if wrong:
        raise DomainError(
            f"v{version.version} is a {version.get_runtime_display()} version; "
            f"{', '.join(wrong)} run{'s' if len(wrong) == 1 else ''} another runtime",
            field="version",
        )


def check_loadable(deployment: Deployment, version: ModelVersion) -> None:
    if deployment.archived_at is not None:
        raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
    if version.model_id != deployment.model_id:
        raise DomainError(
            f"version belongs to {version.model.name}, the deployment serves {deployment.model.name}",
            field="version",
        )
    if version.status in (Status.REJECTED, Status.ARCHIVED):
        raise DomainError(f"version {version.version} is {version.status}", field="version")
    if deployment.production and version.status != Status.APPROVED:
        raise DomainError(
            f"production deployments load approved versions only; version {version.version} "
            f"is {version.status}",
            field="version",
        )


def record_event(load: ModelLoad, message: str, state: str | None = None) -> None:
    """Add a line to the load's history (``state``: the state it is written under, the load's
    own by default)."""
    ModelLoadEvent.objects.create(load=load, state=state or load.state, message=message)


def _lock_and_find_busy(server: InferenceServer, version: ModelVersion) -> ModelLoad | None:
    """Lock the server row (requests per server go one at a time: the check and the write
    belong together) and return a load or unload of the same model in flight on it."""
    InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
    return (
        ModelLoad.objects.filter(
            server=server, version__model=version.model, state__in=ModelLoad.IN_FLIGHT
        )
        .select_related("version")
        .first()
    )


def _refuse_shared_name(server: InferenceServer, version: ModelVersion) -> None:
    """Keep another tenant's model off a server where the two would share a name.

    On Triton each tenant's model has a name of its own on the server (see
    ``Model.name_on``). A vLLM server serves models by the name clients send, unqualified:
    it carries one tenant's model of a name, and a base model rolled onto it replaces what
    every tenant's adapters ran on, so neither is done over another tenant's models.
    """
    if version.name_on(server) != version.model.name:
        return
    theirs = ModelLoad.objects.filter(
        server=server, state__in=[*ModelLoad.IN_FLIGHT, State.READY]
    ).exclude(tenant_id=version.model.tenant_id)
    if is_lora(version):
        theirs = theirs.filter(version__model__name=version.model.name)
        if theirs.exists():
            raise Conflict(
                f"{server.name} serves another tenant's model named {version.model.name}: a vLLM "
                "server knows a model by the name clients send, so it carries one tenant's model "
                "of a name; load onto another server",
                field="servers",
            )
    elif theirs.exists():
        raise Conflict(
            f"{server.name} serves other tenants' models: rolling a base model onto it would "
            "replace what they run on; load onto a server of your own",
            field="servers",
        )


def request_load(
    actor: Any,
    deployment: Deployment,
    version: ModelVersion,
    *,
    server_names: list[str] | None = None,
    idempotency_key: str = "",
) -> tuple[list[ModelLoad], bool]:
    """Ask for ``version`` on the deployment's servers; returns (loads, anything new).

    A version already ready on a server is not loaded again. Another load of the same model
    in flight on a server is a Conflict. The same idempotency key with the same request
    returns the loads it created the first time; with another request it is a Conflict.
    """
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    check_loadable(deployment, version)
    servers = _servers(deployment, server_names)
    check_runtime(version, servers)
    fingerprint = idempotency.fingerprint(
        kind="load", deployment=deployment, version=version, servers=[s.pk for s in servers],
        config_override=None)
    # The server locks make requests with one key go one at a time; should another one win
    # the insert all the same, the unique constraint has the last word.
    return idempotency.create_once(
        lambda: _create_loads(actor, deployment, version, servers, idempotency_key, fingerprint),
        key=idempotency_key, replay=lambda: _replay(deployment, idempotency_key, fingerprint))


def load_for(
    deployment: Deployment, version: ModelVersion, server_names: list[str] | None, label: str,
    *, config_override: dict[str, Any] | None = None,
) -> tuple[list[ModelLoad], bool]:
    """:func:`request_load` by the system on someone's behalf (a rollout loading its
    version: the rollout's requester was checked when it was made); ``label`` names it.
    ``config_override``: the full Triton config to load with instead of the version's (a
    benchmark measuring configs; the version need not be approved for that)."""
    if config_override is None:
        check_loadable(deployment, version)
    servers = _servers(deployment, server_names)
    check_runtime(version, servers)
    fingerprint = idempotency.fingerprint(
        kind="load", deployment=deployment, version=version, servers=[s.pk for s in servers],
        config_override=config_override)
    return _create_loads(None, deployment, version, servers, "", fingerprint, label=label,
                         config_override=config_override)


def _replay(deployment: Deployment, key: str, fingerprint: str) -> list[ModelLoad] | None:
    """The loads an earlier request with ``key`` made, or None; a Conflict if that request
    asked for something else."""
    earlier = list(ModelLoad.objects.filter(tenant=deployment.tenant, idempotency_key=key))
    if not earlier:
        return None
    idempotency.check_replay(earlier[0].request_fingerprint, fingerprint)
    return earlier


def _create_loads(
    actor: Any,
    deployment: Deployment,
    version: ModelVersion,
    servers: list[InferenceServer],
    idempotency_key: str,
    fingerprint: str,
    label: str = "",
    config_override: dict[str, Any] | None = None,
) -> tuple[list[ModelLoad], bool]:
    token = token_of(actor)
    loads: list[ModelLoad] = []
    created: list[ModelLoad] = []
    with transaction.atomic():
        # Deleting the deployment, and marking it production, take the same lock: it is never
        # archived under a new load, nor made production with an unapproved one on its way.
        locked = Deployment.objects.select_for_update().only("archived_at", "production").get(pk=deployment.pk)
        if locked.archived_at:
            raise Conflict(f"deployment {deployment.name} is archived", field="deployment")
        if config_override is None and locked.production:
            deployment.production = True
            check_loadable(deployment, version)
        # The key is looked up under the locks of every server it could write a load to, so
        # a retry racing the first request waits for it and then replays it.
        for server in servers:
            InferenceServer.objects.select_for_update().filter(pk=server.pk).first()
        if idempotency_key:
            earlier = _replay(deployment, idempotency_key, fingerprint)
            if earlier is not None:
                return earlier, False
        for server in servers:
            busy = _lock_and_find_busy(server, version)
            if busy is not None:
                raise Conflict(
                    f"{busy.get_state_display().lower()} of {version.model.name} "
                    f"v{busy.version.version} is in flight on {server.name} (load {busy.pk}): "
                    "wait for it to finish",
                    field="version",
                )
            ready = ModelLoad.objects.filter(server=server, version=version, state=State.READY).first()
            if ready is not None and config_override is None:
                loads.append(ready)
                continue
            if ready is not None:
                raise Conflict(f"v{version.version} is loaded on {server.name} already: a load "
                               "with another config needs it unloaded first", field="version")
            _refuse_managed(server, f"load v{version.version} onto it")
            _refuse_shared_name(server, version)
            neighbours.refuse_guarded(server, deployment)
            load = ModelLoad.objects.create(
                tenant=deployment.tenant,
                deployment=deployment,
                server=server,
                version=version,
                idempotency_key=idempotency_key,
                request_fingerprint=fingerprint,
                requested_by=None if token else actor,
                requested_by_token=token,
                requested_by_label=label or actor_label(actor),
                config_override=config_override,
                request_id=logs.REQUEST_ID.get(),
            )
            record_event(load, f"load of v{version.version} onto {server.name} requested by {load.requested_by_label}")
            audit.record(actor, "requested_load", load, tenant=deployment.tenant,
                         after={"version": version.version, "server": server.name})
            loads.append(load)
            created.append(load)
        for load in created:
            _enqueue_on_commit(load.pk)
    return loads, bool(created)


def request_unload(
    actor: Any, deployment: Deployment, version: ModelVersion, *, server_names: list[str] | None = None
) -> list[ModelLoad]:
    """Take ``version`` off the deployment's servers (those where it is ready)."""
    require_role(actor, deployment.tenant, Membership.Role.DEPLOYER)
    return unload_for(actor, deployment, version, server_names=server_names)


def unload_for(
    actor: Any, deployment: Deployment, version: ModelVersion, *,
    server_names: list[str] | None = None, label: str = "",
) -> list[ModelLoad]:
    """:func:`request_unload` once the caller's right to it is settled (``actor`` None: the
    system, e.g. a rollout taking back its version; ``label`` names it in the history)."""
    if version.model_id != deployment.model_id:
        raise DomainError("version belongs to another model", field="version")
    servers = _servers(deployment, server_names)
    label = label or actor_label(actor)
    moved: list[ModelLoad] = []
    with transaction.atomic():
        # A version the route still sends traffic to stays loaded until the traffic moves.
        routes.check_unload(deployment, version, servers)
        for server in servers:
            busy = _lock_and_find_busy(server, version)
            if busy is not None and not (busy.version_id == version.pk and busy.state == State.UNLOADING):
                raise Conflict(
                    f"v{busy.version.version} is {busy.state} on {server.name}: wait for it to finish",
                    field="version",
                )
            load = busy or ModelLoad.objects.filter(server=server, version=version, state=State.READY).first()
            if load is None:
                continue
            if load.state == State.READY:
                _refuse_managed(server, f"unload v{version.version} from it")
            if load.state == State.READY:
                ModelLoad.objects.filter(pk=load.pk, state=State.READY).update(
                    state=State.UNLOADING, unload_requested_by_label=label,
                    phase_started_at=timezone.now(), attempts=0, error="",
                )
                load.refresh_from_db()
                record_event(load, f"unload from {server.name} requested by {label}")
                audit.record(actor, "requested_unload", load, tenant=deployment.tenant,
                             after={"version": version.version, "server": server.name})
                _enqueue_on_commit(load.pk)
            moved.append(load)
    return moved


def _enqueue_on_commit(load_id: int) -> None:
    """Hand the load to a worker once its row is committed; with the broker down the request
    still succeeds and the next reconcile tick (``due_loads``) picks the load up."""
    send_soon("rollouts.tasks.advance_load", load_id)
