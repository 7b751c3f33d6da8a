from django.apps import AppConfig


class LocalConfig(AppConfig):
    """What Switchyard runs on this host for the demo and the tests: the local cluster, its
    real Triton, vLLM, nginx and moto processes, the demo's data and its runner. No product
    module imports this app: it plugs into the product where the product asks for a plugin."""

    name = "local"
    verbose_name = "Switchyard local runtime"

    def ready(self) -> None:
        from fleet.inventory.runtimes import register_base_model_roller
        from fleet.models import Cluster

        # vLLM servers of the local cluster run on this host: rolling one to a new base model
        # starts a new process here (imported on the first roll, not now).
        register_base_model_roller(Cluster.Kind.LOCAL, "local.vllm_roll.roll_runtime_for")
