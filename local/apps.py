from django.apps import AppConfig


class LocalConfig(AppConfig):
    """What Switchyard runs on this host for the demo and the tests: the local cluster, its
    real Triton, vLLM, nginx and moto processes, the demo's data and its runner. No product
    module imports this app."""

    name = "local"
    verbose_name = "Switchyard local runtime"
