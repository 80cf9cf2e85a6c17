"""Events API: ``GET /api/v1/events/`` (newest first) and ``/api/v1/events/{id}/``, read-only.

Filters: ``?deployment=<id>``, ``?node=<name>``, ``?device=<name>``, ``?kind=<kind>`` (repeatable),
``?since=<ISO time>``, ``?fleet=true`` (events of no deployment); paginated like every list.
"""

from __future__ import annotations

import django_filters
from rest_framework import mixins, serializers, viewsets

from controlplane.deployments.events import event_list
from controlplane.deployments.models import DeploymentEvent


class DeploymentEventSerializer(serializers.ModelSerializer):
    kind_display = serializers.CharField(source="get_kind_display", read_only=True)
    deployment_name = serializers.CharField(source="deployment.name", read_only=True, default=None,
                                            allow_null=True)

    class Meta:
        model = DeploymentEvent
        fields = ["id", "at", "kind", "kind_display", "deployment", "deployment_name", "node", "device",
                  "message", "detail"]


class DeploymentEventFilterSet(django_filters.FilterSet):
    kind = django_filters.MultipleChoiceFilter(choices=DeploymentEvent.Kind.choices)
    since = django_filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    fleet = django_filters.BooleanFilter(field_name="deployment", lookup_expr="isnull",
                                         label="Only events of no deployment (nodes, the fleet).")

    class Meta:
        model = DeploymentEvent
        fields = ["deployment", "node", "device", "kind", "since", "fleet"]


class DeploymentEventViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """What happened to deployments and nodes, as the controller recorded it (docs/deployments.md)."""

    queryset = event_list()
    serializer_class = DeploymentEventSerializer
    filterset_class = DeploymentEventFilterSet
    ordering_fields = ["at", "kind"]
