from __future__ import annotations

import django_filters
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.db.models.fields.json import KeyTransform

from controlplane.inventory.models import (
    DECLARED,
    DECLARED_DISPLAY,
    UNKNOWN_HEALTH,
    UNREGISTERED,
    UNSAMPLED,
    Device,
    Link,
    Node,
)

# What the database's integer columns hold: a number beyond is a 400 naming the parameter, not an
# overflow in the database driver (a 500).
INT64 = {"min_value": -(2**63), "max_value": 2**63 - 1}


class NodeFilterSet(django_filters.FilterSet):
    q = django_filters.CharFilter(method="search", label="Search name and address")
    name = django_filters.CharFilter(lookup_expr="iexact")
    status = django_filters.MultipleChoiceFilter(
        choices=[(DECLARED, DECLARED_DISPLAY), *Node.Status.choices], method="filter_status",
        label="Status as shown (Node.liveness): declared, ready, suspect, lost")
    intent = django_filters.MultipleChoiceFilter(choices=Node.Intent.choices)
    label = django_filters.CharFilter(
        method="filter_label", label="Labels as key:value, several separated by commas"
    )

    class Meta:
        model = Node
        fields = ["fleet"]

    def search(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        return queryset.filter(Q(name__icontains=value) | Q(address__icontains=value))

    def filter_status(self, queryset: QuerySet, name: str, value: list[str]) -> QuerySet:
        """What the ``status`` field shows: ``declared`` for a node no agent has registered, its
        observed status for the others."""
        if not value:
            return queryset
        shown = Q(status__in=[v for v in value if v != DECLARED]) & ~UNREGISTERED
        return queryset.filter(shown | UNREGISTERED if DECLARED in value else shown)

    def filter_label(self, queryset: QuerySet, name: str, value: str) -> QuerySet:
        """Nodes carrying every given label; the key goes through a transform, never a lookup path."""
        for i, pair in enumerate(value.split(",")):
            key, sep, label_value = pair.partition(":")
            if not sep or not key:
                raise ValidationError({"label": f"expected key:value, got {pair!r}"})
            queryset = queryset.alias(**{f"_label{i}": KeyTransform(key, "labels")}).filter(
                **{f"_label{i}": label_value}
            )
        return queryset


class DeviceFilterSet(django_filters.FilterSet):
    node_name = django_filters.CharFilter(field_name="node__name", lookup_expr="iexact")
    model_name = django_filters.CharFilter(lookup_expr="iexact")
    health = django_filters.MultipleChoiceFilter(
        choices=[*Device.Health.choices, (UNKNOWN_HEALTH, "Unknown")], method="filter_health",
        label="Health as shown (Device.shown_health): healthy, degraded, unhealthy, unknown")
    memory_bytes__gte = django_filters.NumberFilter(field_name="memory_bytes", lookup_expr="gte", **INT64)
    memory_bytes__lte = django_filters.NumberFilter(field_name="memory_bytes", lookup_expr="lte", **INT64)

    class Meta:
        model = Device
        fields = ["node", "vendor", "emulated", "nvlink_island", "uuid"]

    def filter_health(self, queryset: QuerySet, name: str, value: list[str]) -> QuerySet:
        """What the ``health`` field shows: ``unknown`` for a card of a node no agent has registered and
        no override, the effective health for the others."""
        if not value:
            return queryset
        shown = Q(health__in=[v for v in value if v != UNKNOWN_HEALTH]) & ~UNSAMPLED
        return queryset.filter(shown | UNSAMPLED if UNKNOWN_HEALTH in value else shown)


class LinkFilterSet(django_filters.FilterSet):
    node = django_filters.NumberFilter(method="filter_node", label="Links touching this node or its devices",
                                       **INT64)
    device = django_filters.NumberFilter(method="filter_device", label="Links touching this device", **INT64)

    class Meta:
        model = Link
        fields = ["kind"]

    def filter_node(self, queryset: QuerySet, name: str, value: int) -> QuerySet:
        return queryset.filter(
            Q(node_a=value) | Q(node_b=value) | Q(device_a__node=value) | Q(device_b__node=value)
        )

    def filter_device(self, queryset: QuerySet, name: str, value: int) -> QuerySet:
        return queryset.filter(Q(device_a=value) | Q(device_b=value))
