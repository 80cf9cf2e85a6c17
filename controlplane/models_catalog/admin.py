from django.contrib import admin

from controlplane.models_catalog.models import LlmModel


@admin.register(LlmModel)
class LlmModelAdmin(admin.ModelAdmin):
    list_display = ["name", "model_type", "num_layers", "total_params", "has_weights", "path"]
    list_filter = ["model_type", "has_weights"]
    search_fields = ["name", "path"]
    readonly_fields = ["config", "profile"]
