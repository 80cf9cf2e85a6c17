"""The admin's view of deployments: their service-level targets are edited here, through
``deployment_update`` (checked together, audited); the plan, the observed state and the serving switches
only through the API, whose services act on a change."""

from django.contrib import admin

from controlplane.audit.services import audit_context
from controlplane.deployments.models import Deployment
from controlplane.deployments.services import deployment_update
from controlplane.deployments.targets import TARGET_FIELDS


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ["name", "model", "status", "priority", "ttft_target_ms", "tpot_target_ms",
                    "target_percentile", "min_replicas", "max_replicas"]
    list_filter = ["status"]
    search_fields = ["name"]
    fields = ["name", "model", "status", "status_message", *TARGET_FIELDS]
    readonly_fields = ["name", "model", "status", "status_message"]

    def has_add_permission(self, request) -> bool:
        return False  # a deployment starts from a plan: POST /api/v1/deployments/

    def save_model(self, request, obj, form, change) -> None:
        targets = {name: form.cleaned_data[name] for name in form.changed_data if name in TARGET_FIELDS}
        deployment_update(deployment=Deployment.objects.get(pk=obj.pk), targets=targets,
                          actor=audit_context(request, via="admin"))
