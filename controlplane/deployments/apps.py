from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    """Plans made real: deployments, their plan revisions and stages, reconcile and node health."""

    name = "controlplane.deployments"
    label = "deployments"
    verbose_name = "Deployments"
