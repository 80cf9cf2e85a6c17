from django.contrib import admin

from controlplane.audit.services import audit_context
from controlplane.gateway.models import ApiKey
from controlplane.gateway.services import api_key_revoke


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Lists and revokes keys; new keys come from ``manage.py create_api_key`` (the key is shown once)."""

    list_display = ("name", "prefix", "user", "created", "revoked_at")
    list_filter = ("revoked_at",)
    readonly_fields = ("user", "name", "prefix", "key_hash", "revoked_at", "created", "last_updated")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset) -> None:
        actor = audit_context(request, via="admin")
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=actor)
