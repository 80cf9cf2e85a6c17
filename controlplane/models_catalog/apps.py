from django.apps import AppConfig


class ModelsCatalogConfig(AppConfig):
    name = "controlplane.models_catalog"
    label = "models_catalog"
    verbose_name = "Model catalog"
