from django.contrib import admin

from controlplane.audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the trail is written by the actions it records, never by hand."""

    list_display = ("at", "actor_label", "via", "action", "target_type", "target_label", "remote_addr")
    list_filter = ("action", "via", "target_type")
    search_fields = ("actor_label", "target_label", "action")
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
