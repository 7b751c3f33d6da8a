from django.urls import path

from console import views

app_name = "console"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("live/fleet-health/", views.fleet_health_partial, name="fleet-health"),
    path("audit/", views.audit_log, name="audit"),
    path("audit/export/", views.audit_export, name="audit-export"),
]
