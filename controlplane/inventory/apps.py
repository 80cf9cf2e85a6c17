from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "controlplane.inventory"
    label = "inventory"
    verbose_name = "Inventory"
