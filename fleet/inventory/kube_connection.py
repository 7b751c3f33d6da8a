"""How Switchyard reaches a Kubernetes cluster's API, and the "test connection" action.

A cluster row holds the access details (``Cluster.kube_*``); the secret (a bearer token or a
kubeconfig) is stored encrypted (``fleet.inventory.secrets``) or referenced from the environment
(``kube_secret_env``, only a variable ``SWITCHYARD_KUBE_SECRET_ENV_ALLOWED`` names: checked when
it is set and again before it is read), and never shown back in full: the API and the console
show :func:`secret_hint`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.conf import settings
from django.utils import timezone

from console.celery import send_now
from console.exceptions import DomainError
from fleet.adapters import kubernetes as kube
from fleet.inventory import secrets
from fleet.models import Cluster

#: The longest token or kubeconfig accepted (a kubeconfig with embedded certificates is a few
#: KiB).
MAX_SECRET = 65536


class NotKubernetes(DomainError):
    """The cluster is not a Kubernetes cluster."""


def set_secret(cluster: Cluster, plain: str) -> None:
    """Store ``plain`` (a token or kubeconfig) encrypted on ``cluster`` (not saved yet)."""
    cluster.kube_secret_encrypted = secrets.encrypt(plain)


def change_secret(cluster: Cluster, *, secret: str | None, secret_env: str | None) -> None:
    """Apply what a caller gave for the cluster's secret (the API and the console form alike;
    the cluster is not saved here).

    ``secret``: a new token or kubeconfig; ``""`` keeps the stored one; ``None`` removes it.
    ``secret_env``: the name of the environment variable that holds it, ``""`` for none, or
    ``None`` when the caller did not say. The one given last wins: a new secret clears the
    variable, a variable removes the stored secret; both at once is refused on ``kube_secret``.
    A variable the platform does not allow is refused on ``kube_secret_env``.
    """
    if secret and secret_env:
        raise DomainError(
            "give the token or kubeconfig, or the environment variable that holds it "
            "(kube_secret_env), not both",
            field="kube_secret",
        )
    if secret_env:
        secrets.check_env_name(secret_env)
    if secret:
        set_secret(cluster, secret)
        cluster.kube_secret_env = ""
    elif secret is None:
        cluster.kube_secret_encrypted = ""
    if secret_env is not None:
        cluster.kube_secret_env = secret_env
        if secret_env:
            cluster.kube_secret_encrypted = ""


def secret_of(cluster: Cluster) -> str:
    """The plain token or kubeconfig of ``cluster``: stored, else from its environment
    variable. DomainError (field ``kube_secret_env``) when the variable is not one the platform
    allows (it is not read), or is not set."""
    if cluster.kube_secret_encrypted:
        return secrets.decrypt(cluster.kube_secret_encrypted, field="kube_secret")
    if cluster.kube_secret_env:
        # Checked again here: the row may predate the setting, or have been written directly.
        secrets.check_env_name(cluster.kube_secret_env)
        value = os.environ.get(cluster.kube_secret_env)
        if value is None:
            raise DomainError(
                f"the environment variable {cluster.kube_secret_env} is not set where "
                "Switchyard runs",
                field="kube_secret_env",
            )
        return value
    return ""


def secret_hint(cluster: Cluster) -> str:
    """What may be shown of the cluster's secret."""
    if cluster.kube_secret_env:
        return f"from ${cluster.kube_secret_env}"
    if cluster.kube_secret_encrypted:
        try:
            return "stored, " + secrets.hint(secret_of(cluster))
        except DomainError:
            return "stored, unreadable with the current key"
    return ""


def access_for(cluster: Cluster) -> kube.KubeAccess:
    """The adapter's access details for ``cluster``."""
    if not cluster.is_kubernetes:
        raise NotKubernetes(f"cluster {cluster.name} is a {cluster.kind} cluster", field="kind")
    secret = secret_of(cluster)
    timeout = settings.SWITCHYARD_KUBE_TIMEOUT_S
    if cluster.kube_auth == Cluster.KubeAuth.TOKEN:
        return kube.KubeAccess(auth=kube.TOKEN, url=cluster.api_url, token=secret,
                               ca_bundle=cluster.kube_ca_bundle, timeout_s=timeout)
    if cluster.kube_auth == Cluster.KubeAuth.KUBECONFIG:
        return kube.KubeAccess(auth=kube.KUBECONFIG, kubeconfig=secret,
                               context=cluster.kube_context, timeout_s=timeout)
    return kube.KubeAccess(auth=kube.IN_CLUSTER, timeout_s=timeout)


def record_connection(cluster: Cluster, *, ok: bool, detail: str, version: str = "") -> None:
    """Remember what the last call to the cluster's API said."""
    fields = {
        "connection_state": Cluster.ConnectionState.OK if ok else Cluster.ConnectionState.FAILED,
        "connection_detail": detail[:500],
        "connection_checked_at": timezone.now(),
    }
    if version:
        fields["kube_server_version"] = version[:100]
    Cluster.objects.filter(pk=cluster.pk).update(**fields)
    for name, value in fields.items():
        setattr(cluster, name, value)


@dataclass(frozen=True)
class ConnectionResult:
    """What "test connection" found: ``ok``, a readable ``detail`` and the server's version
    (empty when it could not be had)."""

    ok: bool
    detail: str
    server_version: str = ""


def test_connection(cluster: Cluster) -> ConnectionResult:
    """Ask the cluster's API server for its version and list its nodes with the cluster's
    credentials (``fleet.adapters.kubernetes.check_connection``); record and return what
    happened. A failure (refused credentials, RBAC, TLS, no answer, a missing environment
    variable, an unreadable stored secret) is a result, not an error. NotKubernetes (400 on
    ``kind``) for a cluster of another kind."""
    if not cluster.is_kubernetes:
        raise NotKubernetes(
            f"cluster {cluster.name} is a {cluster.kind} cluster: only kubernetes clusters "
            "have an API to test", field="kind",
        )
    try:
        found = kube.check_connection(access_for(cluster))
    except (kube.KubeError, DomainError) as exc:
        record_connection(cluster, ok=False, detail=exc.message)
        return ConnectionResult(ok=False, detail=exc.message)
    nodes = f"{found.nodes} node{'' if found.nodes == 1 else 's'}"
    detail = f"connected: Kubernetes {found.server_version}, {nodes} listed"
    record_connection(cluster, ok=True, detail=detail, version=found.server_version)
    return ConnectionResult(ok=True, detail=detail, server_version=found.server_version)


# Not a test, whatever pytest makes of the name where it is imported.
test_connection.__test__ = False  # type: ignore[attr-defined]


def queue_sync(cluster: Cluster) -> bool:
    """The "sync now" action: queue ``fleet.tasks.sync_kube_cluster`` for ``cluster``. False
    when the broker cannot take it (the periodic sync comes anyway). NotKubernetes (400 on
    ``kind``) for a cluster of another kind."""
    if not cluster.is_kubernetes:
        raise NotKubernetes(
            f"cluster {cluster.name} is a {cluster.kind} cluster: only kubernetes clusters are "
            "synced", field="kind",
        )
    return send_now("fleet.tasks.sync_kube_cluster", cluster.pk, True)  # full: a list, not a watch


def sync_queued_text(cluster: Cluster, queued: bool) -> str:
    """What to tell whoever asked for a sync."""
    if queued:
        return f"a sync of {cluster.name} is queued"
    return (f"the task queue cannot be reached: {cluster.name} is synced at the next periodic "
            "sync instead")
