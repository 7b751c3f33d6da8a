from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from console.api import write_datetimes_in_utc

        write_datetimes_in_utc()
