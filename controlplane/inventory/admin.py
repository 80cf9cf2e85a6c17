from django.contrib import admin

from controlplane.audit.services import audit_context, audit_record
from controlplane.inventory.models import Device, Link, Node


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "address", "status", "intent", "network_gbps", "fleet", "last_heartbeat"]
    list_filter = ["status", "intent", "fleet"]
    # Liveness writes status, the node actions (API, dashboard: checked and audited) intent.
    readonly_fields = ["status", "intent", "last_heartbeat", "incarnation"]
    search_fields = ["name", "address"]


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["__str__", "model_name", "memory_bytes", "emulated", "health", "health_override"]
    list_filter = ["emulated", "health", "model_name"]
    list_select_related = ["node"]
    readonly_fields = ["health", "observed_health", "health_reason"]  # derived; health_override is the knob
    search_fields = ["node__name", "model_name", "uuid"]

    def save_model(self, request, obj, form, change) -> None:
        """Saved in the admin's transaction; a changed override is audited as through the API."""
        super().save_model(request, obj, form, change)
        if change and "health_override" in form.changed_data:
            detail = {"from": form.initial.get("health_override"), "to": obj.health_override}
            actor = audit_context(request, via="admin")
            audit_record(actor=actor, action="device.health_override", target=obj, detail=detail)


@admin.register(Link)
class LinkAdmin(admin.ModelAdmin):
    list_display = ["__str__", "kind", "bandwidth_gbs", "latency_us"]
    list_filter = ["kind"]
    list_select_related = ["node_a", "node_b", "device_a__node", "device_b__node"]
