from django.apps import AppConfig


class CommonConfig(AppConfig):
    """Shared API bases and the self-hosted API docs page (its template lives here)."""

    name = "controlplane.common"
    label = "common"
