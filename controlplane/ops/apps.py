from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Operating the control plane itself: the local launcher and the first admin account."""

    name = "controlplane.ops"
    label = "ops"
