from .audit import AuditEvent
from .inventory import GPU, Cluster, ClusterSync, InferenceServer, Node
from .quotas import DevicePrice, Placement, Quota, QuotaRequest
from .tenancy import APIToken, Cohort, Membership, Tenant, TenantNamespace
from .webhooks import Webhook, WebhookDelivery

__all__ = [
    "GPU",
    "APIToken",
    "AuditEvent",
    "Cluster",
    "ClusterSync",
    "Cohort",
    "DevicePrice",
    "InferenceServer",
    "Membership",
    "Node",
    "Placement",
    "Quota",
    "QuotaRequest",
    "Tenant",
    "TenantNamespace",
    "Webhook",
    "WebhookDelivery",
]
