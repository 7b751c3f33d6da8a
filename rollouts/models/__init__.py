from .benchmarks import BenchmarkJob
from .deployments import Deployment
from .latency import LatencyRollup
from .loads import ModelLoad, ModelLoadEvent
from .metrics import MetricTemplate
from .registry import Alias, Model, ModelVersion
from .rollouts import Rollout, RolloutAnalysis, RolloutApproval, RolloutEvent
from .routes import Route, RouteRevision
from .slo import RoutedMinute, SloAlert, SloDisturbance, SloStatus
from .workloads import ServerWorkload

__all__ = [
    "Alias",
    "BenchmarkJob",
    "Deployment",
    "LatencyRollup",
    "MetricTemplate",
    "Model",
    "ModelLoad",
    "ModelLoadEvent",
    "ModelVersion",
    "Rollout",
    "RolloutAnalysis",
    "RolloutApproval",
    "RolloutEvent",
    "Route",
    "RouteRevision",
    "RoutedMinute",
    "ServerWorkload",
    "SloAlert",
    "SloDisturbance",
    "SloStatus",
]
