from __future__ import annotations

from django.db import transaction
from django.db.models import Count
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from contracts import gpu_catalog
from controlplane.audit.services import audit_context, audit_record
from controlplane.common.api import ResourceViewSet
from controlplane.inventory import services
from controlplane.inventory.api import filtersets, serializers
from controlplane.inventory.models import Device, Link, Node


class NodeViewSet(ResourceViewSet):
    """Hosts of the fleet: ``status`` is observed (ready, suspect, lost), ``intent`` the operator's
    (schedulable, cordoned, draining), changed by POST .../cordon/, /uncordon/, /drain/, /undrain/."""

    queryset = Node.objects.annotate(device_count=Count("devices"))
    serializer_class = serializers.NodeSerializer
    filterset_class = filtersets.NodeFilterSet


class DeviceViewSet(ResourceViewSet):
    """GPUs: capacity, speed and health; emulated ones come from fleet files."""

    queryset = Device.objects.select_related("node")
    serializer_class = serializers.DeviceSerializer
    filterset_class = filtersets.DeviceFilterSet

    def perform_update(self, serializer) -> None:
        """A changed ``health_override`` is an operator's word on a card: audited, before and after."""
        before = serializer.instance.health_override
        with transaction.atomic():
            device = serializer.save()
            if device.health_override != before:
                audit_record(actor=audit_context(self.request), action="device.health_override",
                             target=device, detail={"from": before, "to": device.health_override})

    @extend_schema(request=serializers.EmulateThrottleSerializer,
                   responses={202: OpenApiResponse(description="the agent's task is queued")})
    @action(detail=True, methods=["post"], url_path="emulate-throttle")
    def emulate_throttle(self, request: Request, pk: str | None = None) -> Response:
        """Make an emulated device throttle (its stages slow to ``modeled / factor``, its metrics report
        ``sw_thermal``); ``factor: 1`` lets it recover. 400 for a real device."""
        device = self.get_object()
        data = serializers.EmulateThrottleSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        factor = data.validated_data["factor"]
        with transaction.atomic():
            queue = services.device_emulate_throttle(
                device=device, factor=factor, actor=audit_context(request)
            )
        return Response({"device": device.name, "factor": factor, "queue": queue},
                        status=status.HTTP_202_ACCEPTED)


class LinkViewSet(ResourceViewSet):
    """Declared links between two devices (NVLink, PCIe) or two nodes (network)."""

    queryset = Link.objects.select_related("node_a", "node_b", "device_a__node", "device_b__node")
    serializer_class = serializers.LinkSerializer
    filterset_class = filtersets.LinkFilterSet


class GpuModelViewSet(viewsets.ViewSet):
    """The GPU catalog: what a fleet file may name, and the figures a declared device gets."""

    lookup_field = "name"
    lookup_value_regex = "[^/]+"
    serializer_class = serializers.GpuModelSerializer

    def list(self, request: Request) -> Response:
        return Response(self.serializer_class(gpu_catalog.all_models(), many=True).data)

    def retrieve(self, request: Request, name: str) -> Response:
        """One entry by catalog name or alias (case-insensitive; NVML names work too)."""
        try:
            model = gpu_catalog.lookup(name)
        except gpu_catalog.UnknownGpuModel as exc:
            raise NotFound(str(exc)) from None
        return Response(self.serializer_class(model).data)
