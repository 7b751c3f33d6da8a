from django.urls import path

from fleet.inventory import views as inventory
from fleet.quota import views as quota
from fleet.tenancy import views as tenancy
from fleet.webhooks import views as webhooks

app_name = "fleet"
urlpatterns = [
    path("", inventory.overview, name="overview"),
    path("clusters/new/", inventory.cluster_create, name="cluster-create"),
    path("clusters/<int:pk>/", inventory.cluster_detail, name="cluster"),
    path("clusters/<int:pk>/live/", inventory.cluster_live, name="cluster-live"),
    path("clusters/<int:pk>/edit/", inventory.cluster_edit, name="cluster-edit"),
    path("clusters/<int:pk>/test/", inventory.cluster_test, name="cluster-test"),
    path("clusters/<int:pk>/sync/", inventory.cluster_sync, name="cluster-sync"),
    path("servers/live/", inventory.servers_partial, name="servers-live"),
    path("servers/<int:pk>/", inventory.server_detail, name="server"),
    path("servers/<int:pk>/status/", inventory.server_status, name="server-status"),
    path("servers/<int:pk>/check/", inventory.server_check, name="server-check"),
    path("quotas/", quota.quotas, name="quotas"),
    path("quotas/requests/new/", quota.quota_request_create, name="quota-request-create"),
    path("quotas/requests/<int:pk>/decide/", quota.quota_request_decide, name="quota-request-decide"),
    path("tokens/", tenancy.token_list, name="tokens"),
    path("tokens/new/", tenancy.token_create, name="token-create"),
    path("tokens/<int:pk>/revoke/", tenancy.token_revoke, name="token-revoke"),
    path("webhooks/", webhooks.webhook_list, name="webhooks"),
    path("webhooks/new/", webhooks.webhook_create, name="webhook-create"),
    path("webhooks/<int:pk>/", webhooks.webhook_detail, name="webhook"),
    path("webhooks/<int:pk>/test/", webhooks.webhook_test, name="webhook-test"),
    path("webhooks/<int:pk>/toggle/", webhooks.webhook_toggle, name="webhook-toggle"),
    path("webhooks/<int:pk>/delete/", webhooks.webhook_delete, name="webhook-delete"),
]
