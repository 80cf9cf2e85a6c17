from celery.signals import worker_process_init
from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "controlplane.gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        worker_process_init.connect(_worker_traced, weak=False)


def _worker_traced(**_) -> None:
    """A Celery worker's pool process traces its tasks if tracing is on, set up in each one: a span
    processor's thread started before the fork would not run in it."""
    from controlplane.gateway.traces.instrumentation import control_plane_tracing

    control_plane_tracing("worker", django=False)
