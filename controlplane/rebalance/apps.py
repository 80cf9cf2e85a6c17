from django.apps import AppConfig


class RebalanceConfig(AppConfig):
    """The automatic rebalance policy: triggers, damping, proposals an operator accepts or dismisses."""

    name = "controlplane.rebalance"
    label = "rebalance"
    verbose_name = "Rebalance policy"
