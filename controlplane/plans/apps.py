from django.apps import AppConfig


class PlansConfig(AppConfig):
    """The planner's HTTP interface: preview a plan from the live inventory, what-if an edited one."""

    name = "controlplane.plans"
    label = "plans"
