from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from fleet.tenancy import lockouts  # noqa: F401  (audits login lockouts)
