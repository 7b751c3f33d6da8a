from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "rollouts"
    verbose_name = "Registry and rollouts"

    def ready(self) -> None:
        # A change of a cluster's router hands its routes over (fleet sends, rollouts answers:
        # fleet never imports rollouts).
        from fleet.inventory.routers import router_changing
        from rollouts.traffic import handover

        router_changing.connect(handover.hand_over, dispatch_uid="rollouts.handover")
