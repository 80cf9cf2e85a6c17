"""Audit API: ``GET /api/v1/audit/`` (newest first) and ``/api/v1/audit/{id}/``, read-only.

Filters: ``?actor=<label or username>``, ``?action=<prefix>``, ``?target_type=``, ``?target_id=``,
``?since=<ISO time>``; paginated like every list. No method writes: entries are recorded by the
actions themselves (``controlplane.audit.services.audit_record``). Staff only: entries name users,
their API keys' prefixes and their client addresses (``StaffOnly``; anyone else signed in gets 403).
"""

from __future__ import annotations

import django_filters
from django.db.models import Q
from rest_framework import mixins, serializers, viewsets

from controlplane.audit.models import AuditEntry
from controlplane.audit.selectors import audit_entry_list
from controlplane.common.permissions import StaffOnly


class AuditEntrySerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "actor_label", "via", "action", "target_type", "target_id",
                  "target_label", "remote_addr", "detail"]
        read_only_fields = fields


class AuditEntryFilterSet(django_filters.FilterSet):
    actor = django_filters.CharFilter(method="_actor", label="Actor label or username (case-insensitive).")
    action = django_filters.CharFilter(field_name="action", lookup_expr="startswith",
                                       label='Action prefix: "plan" for every plan action.')
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")

    class Meta:
        model = AuditEntry
        fields = ["actor", "action", "target_type", "target_id", "since"]

    def _actor(self, queryset, name, value):
        return queryset.filter(Q(actor_label__iexact=value) | Q(actor__username__iexact=value))


class AuditEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Who changed what, when and from where; staff only (docs/api.md, "Audit trail")."""

    permission_classes = [StaffOnly]
    queryset = audit_entry_list()
    serializer_class = AuditEntrySerializer
    filterset_class = AuditEntryFilterSet
    ordering_fields = ["at", "action", "actor_label"]
