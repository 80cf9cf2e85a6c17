"""``/api/v1/api-keys/``: the gateway's API keys and their limits.

Everyone lists and reads their own keys (staff: all, ``?user=<username>`` to narrow); only staff
change a key's limits (``PATCH``: requests_per_minute, tokens_per_minute, token_budget,
budget_period, allowed_models, max_concurrent_requests), through ``api_key_set_limits``, which audits
the change. Keys are created with ``manage.py create_api_key`` (the key is shown once) and revoked in
the admin.
"""

from __future__ import annotations

from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import PermissionDenied

from controlplane.audit.services import audit_context
from controlplane.common.api import ValidatedModelSerializer
from controlplane.gateway.accounts.services import LIMIT_FIELDS, api_key_set_limits
from controlplane.gateway.models import ApiKey


class ApiKeySerializer(ValidatedModelSerializer):
    user = serializers.CharField(source="user.get_username", read_only=True)
    is_active = serializers.BooleanField(read_only=True)

    class Meta:
        model = ApiKey
        fields = ["id", "name", "prefix", "user", "created", "revoked_at", "is_active", *LIMIT_FIELDS]
        read_only_fields = ["name", "prefix", "created", "revoked_at"]


class ApiKeyViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.UpdateModelMixin,
                    viewsets.GenericViewSet):
    serializer_class = ApiKeySerializer
    http_method_names = ["get", "patch", "head", "options"]
    ordering_fields = ["created", "name"]
    ordering = ["-created"]
    filterset_fields = []

    def get_queryset(self):
        keys = ApiKey.objects.select_related("user").order_by("-created")
        if getattr(self, "swagger_fake_view", False):  # the schema generator: no user
            return keys.none()
        if not self.request.user.is_staff:
            return keys.filter(user=self.request.user)
        if username := self.request.query_params.get("user"):
            keys = keys.filter(user__username=username)
        return keys

    def perform_update(self, serializer: ApiKeySerializer) -> None:
        if not self.request.user.is_staff:
            raise PermissionDenied("only staff change a key's limits")
        limits = {name: value for name, value in serializer.validated_data.items() if name in LIMIT_FIELDS}
        serializer.instance = api_key_set_limits(
            api_key=serializer.instance, actor=audit_context(self.request), **limits)
