from rest_framework.routers import DefaultRouter

from fleet.api import views
from fleet.api.namespaces import TenantNamespaceViewSet
from fleet.api.webhooks import WebhookViewSet

router = DefaultRouter()
router.register("tenants", views.TenantViewSet, basename="tenant")
router.register("tokens", views.APITokenViewSet, basename="token")
router.register("tenant-namespaces", TenantNamespaceViewSet, basename="tenantnamespace")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("quota-requests", views.QuotaRequestViewSet, basename="quotarequest")
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("gpus", views.GPUViewSet, basename="gpu")
router.register("device-prices", views.DevicePriceViewSet, basename="deviceprice")
router.register("servers", views.InferenceServerViewSet, basename="server")
router.register("audit-events", views.AuditEventViewSet, basename="auditevent")
router.register("webhooks", WebhookViewSet, basename="webhook")

urlpatterns = router.urls
