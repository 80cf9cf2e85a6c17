from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import ValidatedModelSerializer
from controlplane.inventory.models import DECLARED, DECLARED_DISPLAY, UNKNOWN_HEALTH, Device, Link, Node

# What a node's status and intent are changed by instead of a write (docs/api.md, "Node intent").
NODE_ACTIONS = ("POST /api/v1/nodes/{id}/cordon/, /uncordon/, /drain/ or /undrain/")


class NodeSerializer(ValidatedModelSerializer):
    """A node: ``status`` is what is seen (liveness), ``intent`` what the operator wants; neither is
    written here (the node actions write the intent, heartbeats the status). A node no agent has
    registered shows ``declared``: nobody has seen it (``Node.liveness``)."""

    url = serializers.HyperlinkedIdentityField(view_name="node-detail")
    status = serializers.ChoiceField(
        source="liveness", read_only=True, choices=[(DECLARED, DECLARED_DISPLAY), *Node.Status.choices],
        help_text="Observed liveness (heartbeats): ready, suspect, lost; declared while no agent has "
                  "registered the node.")
    registered = serializers.BooleanField(read_only=True, help_text="An agent has registered the node.")
    device_count = serializers.SerializerMethodField()
    schedulable = serializers.BooleanField(read_only=True, help_text="intent is schedulable: new stages may "
                                                                      "be placed on it (if it is not lost).")

    class Meta:
        model = Node
        fields = [
            "id", "url", "name", "address", "labels", "network_gbps", "status", "intent", "schedulable",
            "registered", "last_heartbeat", "incarnation", "fleet", "device_count", "created", "last_updated",
        ]
        # Written by the agent that owns the node (and liveness), or by the node actions; never here.
        read_only_fields = ["status", "intent", "last_heartbeat", "incarnation"]

    @extend_schema_field(OpenApiTypes.INT)
    def get_device_count(self, node: Node) -> int:
        """The list's annotation; a node just created or updated has none, and is counted."""
        count = getattr(node, "device_count", None)
        return node.devices.count() if count is None else count

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """A request that tries to change ``status`` or ``intent`` is told which action does it."""
        node = self.instance
        # Sending back what a GET showed, or the stored value, is no write.
        shown = {node.liveness, node.status} if node is not None else {DECLARED, Node.Status.READY}
        intent = node.intent if node is not None else Node.Intent.SCHEDULABLE
        if self.initial_data.get("status", node.liveness if node is not None else DECLARED) not in shown:
            raise serializers.ValidationError({"status": (
                "status is observed (ready, suspect, lost: written by the node's heartbeats), not set; "
                f"to keep new stages off a node, cordon or drain it: {NODE_ACTIONS}")})
        if self.initial_data.get("intent", intent) != intent:
            raise serializers.ValidationError({"intent": (
                f"intent is changed by the node actions, which check and record it: {NODE_ACTIONS}")})
        return super().validate(attrs)


class DeviceSerializer(ValidatedModelSerializer):
    """A GPU: ``health`` is the effective one, ``unknown`` for a card of a node no agent has registered
    (nobody sampled it) unless the operator's ``health_override`` says otherwise (``shown_health``)."""

    url = serializers.HyperlinkedIdentityField(view_name="device-detail")
    health = serializers.ChoiceField(
        source="shown_health", read_only=True, choices=[*Device.Health.choices, (UNKNOWN_HEALTH, "Unknown")],
        help_text="health_override if set, else observed_health; unknown while no agent has registered the "
                  "device's node. The planner keeps off unhealthy devices.")
    name = serializers.CharField(read_only=True)
    node_name = serializers.CharField(source="node.name", read_only=True)

    class Meta:
        model = Device
        fields = [
            "id", "url", "name", "node", "node_name", "index", "uuid", "vendor", "model_name",
            "memory_bytes", "memory_bandwidth_gbs", "fp16_tflops", "bf16_tflops", "int8_tops", "pcie_gen",
            "pcie_lanes", "numa_node", "nvlink_island", "nvlink_bandwidth_gbs", "emulated", "health",
            "observed_health", "health_reason", "health_override", "created", "last_updated",
        ]

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """``health`` is derived (read-only): a request that tries to change it is told what to set."""
        if "health" in self.initial_data:  # sending back what a GET showed, or the stored value, is no write
            device = self.instance
            current = ({device.health, device.shown_health} if device is not None
                       else {Device.Health.HEALTHY, UNKNOWN_HEALTH})
            if self.initial_data["health"] not in current:
                raise serializers.ValidationError({"health": (
                    "health is derived: health_override if set, else observed_health (from the agent's "
                    "samples); set health_override to change it")})
        return super().validate(attrs)


class EmulateThrottleSerializer(serializers.Serializer):
    """``POST /api/v1/devices/{id}/emulate-throttle/``: the share of its speed an emulated card keeps."""

    factor = serializers.FloatField(
        min_value=0.0, max_value=1.0, help_text="In (0, 1]: 0.5 halves its speed, 1 is recovered.")

    def validate_factor(self, value: float) -> float:
        if value <= 0:
            raise serializers.ValidationError("must be greater than 0 (1 = recovered)")
        return value


class LinkSerializer(ValidatedModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="link-detail")
    endpoints = serializers.SerializerMethodField()

    class Meta:
        model = Link
        fields = [
            "id", "url", "kind", "device_a", "device_b", "node_a", "node_b", "endpoints", "bandwidth_gbs",
            "latency_us", "created", "last_updated",
        ]

    def get_endpoints(self, link: Link) -> list[str]:
        """The two endpoints by name (``<node>`` or ``<node>/gpu<i>``)."""
        return [endpoint.name for endpoint in link.endpoints]


class GpuModelSerializer(serializers.Serializer):
    """A GPU catalog entry (contracts/gpu_catalog.py): spec-sheet figures, read-only."""

    name = serializers.CharField()
    aliases = serializers.ListField(child=serializers.CharField())
    vendor = serializers.CharField()
    architecture = serializers.CharField()
    compute_capability = serializers.CharField()
    year = serializers.IntegerField()
    memory_gib = serializers.FloatField()
    memory_bytes = serializers.IntegerField()
    memory_bandwidth_gbs = serializers.FloatField()
    fp16_tflops = serializers.FloatField()
    bf16_tflops = serializers.FloatField()
    int8_tops = serializers.FloatField()
    pcie_gen = serializers.IntegerField()
    pcie_lanes = serializers.IntegerField()
    nvlink_gbs = serializers.FloatField()
