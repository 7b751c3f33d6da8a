from django.urls import path

from fleet import views

app_name = "fleet"
urlpatterns = [
    path("", views.overview, name="overview"),
    path("clusters/new/", views.cluster_create, name="cluster-create"),
    path("clusters/<int:pk>/", views.cluster_detail, name="cluster"),
    path("clusters/<int:pk>/live/", views.cluster_live, name="cluster-live"),
    path("clusters/<int:pk>/edit/", views.cluster_edit, name="cluster-edit"),
    path("clusters/<int:pk>/test/", views.cluster_test, name="cluster-test"),
    path("clusters/<int:pk>/sync/", views.cluster_sync, name="cluster-sync"),
    path("servers/live/", views.servers_partial, name="servers-live"),
    path("servers/<int:pk>/", views.server_detail, name="server"),
    path("servers/<int:pk>/status/", views.server_status, name="server-status"),
    path("servers/<int:pk>/check/", views.server_check, name="server-check"),
    path("quotas/", views.quotas, name="quotas"),
    path("quotas/requests/new/", views.quota_request_create, name="quota-request-create"),
    path("quotas/requests/<int:pk>/decide/", views.quota_request_decide, name="quota-request-decide"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/new/", views.token_create, name="token-create"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("webhooks/", views.webhook_list, name="webhooks"),
    path("webhooks/new/", views.webhook_create, name="webhook-create"),
    path("webhooks/<int:pk>/", views.webhook_detail, name="webhook"),
    path("webhooks/<int:pk>/test/", views.webhook_test, name="webhook-test"),
    path("webhooks/<int:pk>/toggle/", views.webhook_toggle, name="webhook-toggle"),
    path("webhooks/<int:pk>/delete/", views.webhook_delete, name="webhook-delete"),
]
