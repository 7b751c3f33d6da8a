"""Tenants, the people in them and the API tokens that act for them."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from fleet.tenancy import roles
from fleet.tenancy.scoping import scoped_manager

slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$",
    "use lowercase letters, digits and dashes (1-64 characters, no leading or trailing dash)",
)


class Cohort(models.Model):
    """Tenants that lend each other the quota they do not use (Kueue's cohort).

    A member may hold more of a device class than its own quota, up to that quota's
    borrowing limit, while the members' quotas of the class together are not all used. What
    a member holds above its own quota is borrowed, and marked so on the placements that hold
    it. When a lender asks for its own quota back and the cohort has none free, what could be
    reclaimed (the borrowers' placements, lowest priority first) is listed in the refusal;
    with ``reclaim`` set to *unload* those are also unloaded and the lender's load waits for
    them.
    """

    class Reclaim(models.TextChoices):
        LIST = "list", "List what could be reclaimed"
        UNLOAD = "unload", "Unload borrowers, lowest priority first"

    name = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    description = models.CharField(max_length=500, blank=True)
    reclaim = models.CharField(max_length=16, choices=Reclaim.choices, default=Reclaim.LIST,
                               help_text="What a lender's admission does when its quota is lent out")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    """A team that owns models, deployments, quota and tokens. Tenants never see each other."""

    slug = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    cohort = models.ForeignKey(Cohort, null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="tenants",
                               help_text="Tenants that lend each other unused quota")
    guard_production_servers = models.BooleanField(
        default=False,
        help_text="Keep other tenants' loads off the servers that carry this tenant's production "
                  "deployments (a deployment can ask the same for itself)")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("id")

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

namespace_validator = RegexValidator(
    r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$",
    "a Kubernetes namespace name: lowercase letters, digits and dashes (at most 63)",
)

#: Namespaces Kubernetes keeps for itself (``kube-system``, ``kube-public``, ...).
RESERVED_NAMESPACE_PREFIX = "kube-"


class TenantNamespace(models.Model):
    """A Kubernetes namespace a platform admin grants a tenant: its servers run there, and
    the Secrets its versions name are that namespace's (a Secret reference never leaves its
    namespace). ``cluster`` empty: the namespace on every Kubernetes cluster.

    A namespace belongs to one tenant: any pod in it can mount any Secret in it, and a
    tenant chooses its pods' image. So a namespace granted to one tenant (on a cluster, or on
    every cluster) cannot be granted to another on the same cluster; namespaces Kubernetes
    keeps for itself (``kube-*``) are never granted. The first namespace granted to a tenant
    on a cluster is where its servers go when a request names none.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="namespaces")
    cluster = models.ForeignKey(
        "fleet.Cluster", null=True, blank=True, on_delete=models.CASCADE,
        related_name="tenant_namespaces",
        help_text="The Kubernetes cluster (empty: every Kubernetes cluster)",
    )
    namespace = models.CharField(max_length=63, validators=[namespace_validator])
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "id"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "cluster", "namespace"],
                                    name="uniq_tenant_namespace"),
            models.UniqueConstraint(fields=["tenant", "namespace"],
                                    condition=Q(cluster__isnull=True),
                                    name="uniq_tenant_namespace_every_cluster"),
        ]

    def __str__(self) -> str:
        where = self.cluster.name if self.cluster_id else "every cluster"
        return f"{self.namespace} on {where} for {self.tenant}"

    def clean(self) -> None:
        if self.namespace.startswith(RESERVED_NAMESPACE_PREFIX):
            raise ValidationError({"namespace": [
                f"{self.namespace} is one of Kubernetes' own namespaces (kube-*): it is never "
                "granted to a tenant"]})
        if self.cluster_id is not None and not self.cluster.is_kubernetes:
            raise ValidationError({"cluster": [
                f"{self.cluster.name} is not a Kubernetes cluster"]})
        same = TenantNamespace.objects.filter(namespace=self.namespace).exclude(pk=self.pk)
        if self.cluster_id is not None:
            same = same.filter(Q(cluster_id=self.cluster_id) | Q(cluster__isnull=True))
        other = same.exclude(tenant_id=self.tenant_id).select_related("tenant", "cluster").first()
        if other is not None:
            where = f"on {other.cluster.name}" if other.cluster_id else "on every cluster"
            raise ValidationError({"namespace": [
                f"{self.namespace} is granted to tenant {other.tenant.slug} {where}: a "
                "namespace belongs to one tenant (any pod in it can mount its Secrets)"]})
        if self.cluster_id is None and self.tenant_id is not None and same.filter(
                tenant_id=self.tenant_id, cluster__isnull=True).exists():
            raise ValidationError({"namespace": [
                f"{self.namespace} is granted to this tenant on every cluster already"]})


class Membership(models.Model):
    """A person's role in one tenant. Roles are ordered: each includes the ones below it.

    viewer reads; deployer registers versions, edits deployments and aliases; approver also
    approves or rejects versions requested by someone else; admin also manages tokens.
    Platform admins (superusers) act as admin in every tenant.
    """

    Role = roles.Role
    RANK = roles.RANK

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = scoped_manager("tenant")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "tenant"], name="uniq_membership")]
        ordering = ["tenant__slug", "user__username"]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"

    @classmethod
    def rank(cls, role: str) -> int:
        return roles.rank(role)

class APIToken(models.Model):
    """A tenant's credential for scripts and CI, acting with a fixed role in that one tenant.

    The secret is shown once at creation; only a lookup prefix and an HMAC of the whole token
    are stored. States: active → revoked (revoked_at set) or expired (expires_at passed);
    neither can be undone. ``last_used_at`` is updated at most once a minute.

    ``created_by`` is the person who stands behind the token: whoever made it, or, for a token
    made by another token (``created_by_token``), that token's person. Four-eyes approval
    compares these persons. It is empty only when that person's account was deleted.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.DEPLOYER
    )
    prefix = models.CharField(max_length=8, unique=True)
    digest = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_token = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="the token that made this one, when a token made it",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = scoped_manager("tenant")

    class Meta:
        ordering = ["tenant__slug", "name"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    @property
    def is_active(self) -> bool:
        return not self.is_revoked and not self.is_expired

    @property
    def state(self) -> str:
        if self.is_revoked:
            return "revoked"
        return "expired" if self.is_expired else "active"
