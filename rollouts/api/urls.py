from django.urls import path
from rest_framework.routers import DefaultRouter

from rollouts.api import (
                benchmarks,
                costs,
                metric_templates,
                rollouts,
                routes,
                slo_alerts,
                views,
                workloads,
)

router = DefaultRouter()
router.register("models", views.ModelViewSet, basename="model")
router.register("versions", views.ModelVersionViewSet, basename="version")
router.register("aliases", views.AliasViewSet, basename="alias")
router.register("deployments", views.DeploymentViewSet, basename="deployment")
router.register("loads", views.ModelLoadViewSet, basename="load")
router.register("routes", routes.RouteViewSet, basename="route")
router.register("rollouts", rollouts.RolloutViewSet, basename="rollout")
router.register("metric-templates", metric_templates.MetricTemplateViewSet,
                basename="metric-template")
router.register("benchmarks", benchmarks.BenchmarkJobViewSet, basename="benchmark")
router.register("slo-alerts", slo_alerts.SloAlertViewSet, basename="sloalert")
router.register("workloads", workloads.WorkloadViewSet, basename="workload")

# The API's views outside the router (console/urls.py puts them under /api/v1/ too).
extra_urls = [path("chargeback/", costs.ChargebackView.as_view(), name="chargeback")]
urlpatterns = [*extra_urls, *router.urls]
