from django.contrib import admin

from controlplane.audit.services import audit_context
from controlplane.gateway.accounts.services import LIMIT_FIELDS, api_key_revoke, api_key_set_limits
from controlplane.gateway.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Lists and revokes keys and changes their limits (audited, through ``api_key_set_limits``); new
    keys come from ``manage.py create_api_key`` (the key is shown once)."""

    list_display = ("name", "prefix", "user", "created", "revoked_at", "requests_per_minute",
                    "tokens_per_minute", "token_budget", "budget_period", "max_concurrent_requests")
    list_filter = ("revoked_at",)
    readonly_fields = ("user", "name", "prefix", "key_hash", "revoked_at", "created", "last_updated")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    def save_model(self, request, obj, form, change) -> None:
        limits = {name: form.cleaned_data[name] for name in form.changed_data if name in LIMIT_FIELDS}
        api_key_set_limits(api_key=ApiKey.objects.get(pk=obj.pk), actor=audit_context(request, via="admin"),
                           **limits)

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset) -> None:
        actor = audit_context(request, via="admin")
        for api_key in queryset:
            api_key_revoke(api_key=api_key, actor=actor)
