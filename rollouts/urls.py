from django.urls import path

from rollouts.benchmarks import views as benchmark_views
from rollouts.canary import views as rollout_views
from rollouts.deployments import views as deployment_views
from rollouts.loads import views as load_views
from rollouts.registry import views as registry_views
from rollouts.slo import views as slo_views
from rollouts.traffic import views as traffic_views
from rollouts.workloads import views as workload_views

app_name = "rollouts"
urlpatterns = [
    path("", registry_views.model_list, name="models"),
    path("models/new/", registry_views.model_create, name="model-create"),
    path("models/<int:pk>/", registry_views.model_detail, name="model"),
    path("models/<int:pk>/edit/", registry_views.model_edit, name="model-edit"),
    path("models/<int:pk>/versions/new/", registry_views.version_create, name="version-create"),
    path("models/<int:pk>/aliases/", registry_views.alias_set, name="alias-set"),
    path("approvals/", registry_views.approval_queue, name="approvals"),
    path("versions/<int:pk>/", registry_views.version_detail, name="version"),
    path("costs/", registry_views.costs_page, name="costs"),
    path("versions/<int:pk>/<slug:action>/", registry_views.version_action, name="version-action"),
    path("deployments/", deployment_views.deployment_list, name="deployments"),
    path("deployments/new/", deployment_views.deployment_create, name="deployment-create"),
    path("deployments/<int:pk>/", deployment_views.deployment_detail, name="deployment"),
    path("deployments/<int:pk>/edit/", deployment_views.deployment_edit, name="deployment-edit"),
    path("deployments/<int:pk>/loads/", load_views.deployment_loads, name="deployment-loads"),
    path("deployments/<int:pk>/call/", deployment_views.deployment_call, name="deployment-call"),
    path("deployments/<int:pk>/converge/", deployment_views.deployment_converge,
         name="deployment-converge"),
    path("deployments/<int:pk>/slo/", slo_views.deployment_slo, name="deployment-slo"),
    path("slo/", slo_views.slo_summary, name="slo-summary"),
    path("deployments/<int:pk>/load/", load_views.deployment_load_action, name="deployment-load"),
    path("deployments/<int:pk>/delete/", deployment_views.deployment_delete, name="deployment-delete"),
    path("deployments/<int:pk>/route/", traffic_views.deployment_route, name="deployment-route"),
    path("deployments/<int:pk>/route/split/", traffic_views.deployment_route_split,
         name="deployment-route-split"),
    path("deployments/<int:pk>/route/default/", traffic_views.deployment_route_default,
         name="deployment-route-default"),
    path("deployments/<int:pk>/route/remove/", traffic_views.deployment_route_remove,
         name="deployment-route-remove"),
    path("deployments/<int:pk>/rollouts/start/", rollout_views.deployment_rollout_start,
         name="deployment-rollout-start"),
    path("deployments/<int:pk>/benchmarks/start/", benchmark_views.deployment_benchmark_start,
         name="deployment-benchmark-start"),
    path("deployments/<int:pk>/replicas/", workload_views.deployment_replicas,
         name="deployment-replicas"),
    path("deployments/<int:pk>/workloads/", workload_views.deployment_workloads,
         name="deployment-workloads"),
    path("deployments/<int:pk>/workloads/create/", workload_views.deployment_workload_create,
         name="deployment-workload-create"),
    path("workloads/<int:pk>/<slug:action>/", workload_views.workload_action,
         name="workload-action"),
    path("loads/", load_views.load_list, name="loads"),
    path("loads/<int:pk>/", load_views.load_detail, name="load"),
    path("rollouts/", rollout_views.rollout_list, name="rollouts"),
    path("rollouts/<int:pk>/", rollout_views.rollout_detail, name="rollout"),
    path("rollouts/<int:pk>/status/", rollout_views.rollout_status, name="rollout-status"),
    path("rollouts/<int:pk>/latency/", rollout_views.rollout_latency, name="rollout-latency"),
    path("rollouts/<int:pk>/<slug:action>/", rollout_views.rollout_action, name="rollout-action"),
    path("benchmarks/", benchmark_views.benchmark_list, name="benchmarks"),
    path("benchmarks/compare/", benchmark_views.benchmark_compare, name="benchmark-compare"),
    path("benchmarks/<int:pk>/", benchmark_views.benchmark_detail, name="benchmark"),
    path("benchmarks/<int:pk>/status/", benchmark_views.benchmark_status, name="benchmark-status"),
    path("benchmarks/<int:pk>/<slug:action>/", benchmark_views.benchmark_action,
         name="benchmark-action"),
]
