"""What the fleet is made of: nodes, the devices in them, and the links between them.

Rows are written by fleet-file imports (declared, usually emulated devices), by agents (discovered
devices) and by the API. The planner never reads these models: ``selectors.fleet_spec_from_inventory``
turns them into the plain ``FleetSpec`` it works on.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q

from contracts.names import device_name
from controlplane.common.models import TimestampedModel, validate_positive

# What a node no agent has registered shows instead of a status (``Node.liveness``), and the rows that
# are such nodes: one notion for the planner's refusal, the pages and the API.
DECLARED = "declared"
DECLARED_DISPLAY = "Declared (no agent)"
UNREGISTERED = Q(incarnation=0)
UNKNOWN_HEALTH = "unknown"
# The devices whose shown health is UNKNOWN_HEALTH (``Device.shown_health``).
UNSAMPLED = Q(node__incarnation=0, health_override__isnull=True)


class Node(TimestampedModel):
    """A host that runs an agent (or, for an emulated fleet, pretends to).

    What is seen of it and what an operator wants of it are two fields (ARCHITECTURE: "intent and
    observation are separate fields"), and neither writer touches the other's: ``status`` (READY,
    SUSPECT, LOST) is observed liveness, written only by ``deployments.liveness``; ``intent``
    (SCHEDULABLE, CORDONED, DRAINING) is the operator's, written only by the node actions
    (``deployments.node_actions``). A node takes new stages only when it is not LOST and SCHEDULABLE.
    """

    class Status(models.TextChoices):
        READY = "ready", "Ready"
        SUSPECT = "suspect", "Suspect"  # heartbeats late; still planned on, watched
        LOST = "lost", "Lost"  # heartbeats stopped: its devices are down

    class Intent(models.TextChoices):
        SCHEDULABLE = "schedulable", "Schedulable"  # new stages may be placed on it
        CORDONED = "cordoned", "Cordoned"  # no new stages; the running ones stay
        DRAINING = "draining", "Draining"  # no new stages, and its stages were moved off it

    name = models.CharField(max_length=100, unique=True)
    address = models.CharField(max_length=255, blank=True, help_text="Host name or IP of the node's agent.")
    labels = models.JSONField(default=dict, blank=True, help_text="Free-form string labels, e.g. rack.")
    network_gbps = models.FloatField(
        default=25.0, validators=[validate_positive], help_text="Network interface bandwidth, Gbit/s."
    )
    status = models.CharField(
        max_length=16, choices=Status.choices, default=Status.READY,
        help_text="Observed liveness (heartbeats): ready, suspect, lost. Written only by liveness.",
    )
    intent = models.CharField(
        max_length=16, choices=Intent.choices, default=Intent.SCHEDULABLE,
        help_text="The operator's word: schedulable, cordoned (no new stages) or draining (emptied). "
                  "Written only by the cordon, uncordon, drain and undrain actions.",
    )
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    # When the current agent's websocket last closed abnormally (its process died, or the connection
    # was cut): with no heartbeat since, liveness declares the node LOST sooner (deployments/liveness.py).
    connection_closed_at = models.DateTimeField(null=True, blank=True)
    # When a pipeline's head (on another node) last reported its link to a stage on this node broken:
    # with the close above, the agent died with its stages and the node is LOST at once (liveness.py).
    link_broken_at = models.DateTimeField(null=True, blank=True)
    # Bumped each time the node's agent (re)registers, so messages from an older life are ignored.
    incarnation = models.PositiveIntegerField(default=0)
    fleet = models.CharField(max_length=100, blank=True, help_text="Fleet file the node was imported from.")

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(network_gbps__gt=0),
                name="node_network_positive",
                violation_error_message="network_gbps must be greater than 0",
            )
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if "/" in self.name:
            raise ValidationError(
                {"name": "a node name must not contain '/' (device names are <node>/gpu<i>)"}
            )
        if not isinstance(self.labels, dict) or not all(
            isinstance(v, str) for v in [*self.labels, *self.labels.values()]
        ):
            raise ValidationError({"labels": "expected an object of strings to strings"})

    @property
    def schedulable(self) -> bool:
        """The operator lets new stages onto it (neither cordoned nor draining)."""
        return self.intent == self.Intent.SCHEDULABLE

    @property
    def is_down(self) -> bool:
        """Down for the planner: no new stage goes here (LOST, or cordoned or draining)."""
        return self.status == self.Status.LOST or not self.schedulable

    @property
    def registered(self) -> bool:
        """An agent has registered it (``incarnation`` counts registrations). A node only declared, by a
        fleet file or the API, has nobody to receive a stage and nobody who ever saw it: its ``status``
        is the field's default, not an observation."""
        return self.incarnation > 0

    @property
    def liveness(self) -> str:
        """The status every page and the API show: ``DECLARED`` until an agent registers the node,
        then the observed ``status``."""
        return self.status if self.registered else DECLARED

    @property
    def liveness_display(self) -> str:
        return self.get_status_display() if self.registered else DECLARED_DISPLAY

    def unavailable_reason(self) -> str | None:
        """Why no new stage may be placed on it ("lost", "cordoned", "draining"), or None."""
        if self.status == self.Status.LOST:
            return "lost"
        return None if self.schedulable else self.intent


class Device(TimestampedModel):
    """One GPU: its capacity and speed (from NVML and the GPU catalog) and its health.

    Health is three fields, intent and observation kept apart (ARCHITECTURE): ``observed_health``
    (and ``health_reason``) is what the agent's samples show, written only by
    ``health.device_health_observe``; ``health_override`` is what an operator says, written only by
    operator actions (the API, the admin). ``health`` is the effective one every reader uses, the
    override else the observation, kept in step by ``save()`` and by ``device_health_observe``.
    """

    class Health(models.TextChoices):
        HEALTHY = "healthy", "Healthy"
        DEGRADED = "degraded", "Degraded"  # e.g. throttling: still usable, slower
        UNHEALTHY = "unhealthy", "Unhealthy"  # XID errors, fell off the bus: not planned on

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField(
        help_text="Position on the node: the device is <node>/gpu<index>."
    )
    uuid = models.CharField(max_length=64, blank=True, help_text="NVML UUID; empty for declared devices.")
    vendor = models.CharField(max_length=32, default="NVIDIA")
    model_name = models.CharField(max_length=100, help_text="GPU catalog name, or the NVML name if unknown.")
    memory_bytes = models.BigIntegerField(validators=[validate_positive])
    memory_bandwidth_gbs = models.FloatField(validators=[validate_positive], help_text="GB/s")
    fp16_tflops = models.FloatField(validators=[validate_positive], help_text="Dense tensor-core peak.")
    bf16_tflops = models.FloatField(
        validators=[MinValueValidator(0)], help_text="Dense tensor-core peak; 0 when the card has no bf16."
    )
    int8_tops = models.FloatField(
        validators=[MinValueValidator(0)],
        help_text="Dense tensor-core peak; 0 when the card has no int8 path.",
    )
    pcie_gen = models.PositiveSmallIntegerField(default=4)
    pcie_lanes = models.PositiveSmallIntegerField(default=16)
    numa_node = models.PositiveSmallIntegerField(null=True, blank=True)
    nvlink_island = models.CharField(
        max_length=120, blank=True, help_text="Devices sharing an island talk over NVLink."
    )
    nvlink_bandwidth_gbs = models.FloatField(
        default=0.0, validators=[MinValueValidator(0)], help_text="Per-direction GB/s inside the island."
    )
    emulated = models.BooleanField(
        default=False, help_text="Declared by a fleet file, not real hardware: workers run on the CPU."
    )
    health = models.CharField(
        max_length=16, choices=Health.choices, default=Health.HEALTHY, editable=False,
        help_text="Effective health: health_override if set, else observed_health. The planner keeps off "
                  "unhealthy devices.",
    )
    observed_health = models.CharField(
        max_length=16, choices=Health.choices, default=Health.HEALTHY, editable=False,
        help_text="What the agent's samples show: XID or uncorrected ECC errors make a device unhealthy, "
                  "sustained thermal throttling or retired memory pages degraded.",
    )
    health_reason = models.CharField(max_length=255, blank=True, editable=False,
                                     help_text="Why observed_health is not healthy.")
    health_override = models.CharField(
        max_length=16, choices=Health.choices, null=True, blank=True, default=None,
        help_text="An operator's word on the device's health, winning over what is observed; null: none.",
    )

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                name="device_unique_index_per_node",
                violation_error_message="this node already has a device with this index",
            ),
            models.UniqueConstraint(
                fields=["uuid"],
                condition=~Q(uuid=""),
                name="device_unique_uuid",
                violation_error_message="another device has this uuid",
            ),
            models.CheckConstraint(
                condition=Q(memory_bytes__gt=0),
                name="device_memory_positive",
                violation_error_message="memory_bytes must be greater than 0",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def name(self) -> str:
        return device_name(self.node.name, self.index)

    @property
    def shown_health(self) -> str:
        """The health the pages show: ``UNKNOWN_HEALTH`` for a card of a node no agent has registered
        (nobody has sampled it) unless an operator said otherwise, else the effective ``health``."""
        if self.health_override or self.node.registered:
            return self.health
        return UNKNOWN_HEALTH

    def save(self, *args, **kwargs) -> None:
        self.health = effective_health(override=self.health_override, observed=self.observed_health)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and {"health_override", "observed_health"} & set(update_fields):
            kwargs["update_fields"] = {*update_fields, "health"}
        super().save(*args, **kwargs)


def effective_health(*, override: str | None, observed: str) -> str:
    """The health every reader uses: the operator's override, else what the samples show."""
    return override or observed


_DEVICE_PAIR = Q(device_a__isnull=False, device_b__isnull=False, node_a__isnull=True, node_b__isnull=True)
_NODE_PAIR = Q(device_a__isnull=True, device_b__isnull=True, node_a__isnull=False, node_b__isnull=False)


class Link(TimestampedModel):
    """A declared or measured link: two devices (NVLink, PCIe) or two nodes (network).

    Links nobody declared are not stored; the planner assumes NVLink inside an island, PCIe inside a
    node and each node's own network bandwidth between nodes (see ``FleetSpec.link_between``).
    """

    class Kind(models.TextChoices):
        NVLINK = "nvlink", "NVLink"
        PCIE = "pcie", "PCIe"
        NETWORK = "network", "Network"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    device_a = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    device_b = models.ForeignKey(Device, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    node_a = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    node_b = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    bandwidth_gbs = models.FloatField(validators=[validate_positive], help_text="GB/s, one direction.")
    latency_us = models.FloatField(validators=[MinValueValidator(0)], help_text="Microseconds.")

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=_DEVICE_PAIR | _NODE_PAIR,
                name="link_two_devices_or_two_nodes",
                violation_error_message=(
                    "a link joins two devices (device_a, device_b) or two nodes (node_a, node_b)"
                ),
            ),
            models.CheckConstraint(
                condition=~Q(device_a=F("device_b")) & ~Q(node_a=F("node_b")),
                name="link_endpoints_differ",
                violation_error_message="a link joins two different endpoints",
            ),
            models.UniqueConstraint(
                fields=["device_a", "device_b"],
                name="link_unique_device_pair",
                violation_error_message="a link between these two devices already exists",
            ),
            models.UniqueConstraint(
                fields=["node_a", "node_b"],
                name="link_unique_node_pair",
                violation_error_message="a link between these two nodes already exists",
            ),
            models.CheckConstraint(
                condition=Q(bandwidth_gbs__gt=0, latency_us__gte=0),
                name="link_figures",
                violation_error_message="bandwidth_gbs must be greater than 0 and latency_us at least 0",
            ),
        ]

    def __str__(self) -> str:
        a, b = self.endpoints
        return f"{self.kind} {a} <-> {b}"

    @property
    def endpoints(self) -> tuple[Device | Node, Device | Node]:
        if self.device_a_id is not None:
            return self.device_a, self.device_b
        return self.node_a, self.node_b

    def clean(self) -> None:
        """What the constraints cannot say: which kind fits the endpoints, and the pair reversed."""
        devices = self.device_a_id is not None and self.device_b_id is not None
        nodes = self.node_a_id is not None and self.node_b_id is not None
        within_node = self.kind in (self.Kind.NVLINK, self.Kind.PCIE)
        if devices and within_node and self.device_a.node_id != self.device_b.node_id:
            raise ValidationError({"kind": f"{self.kind} joins two devices of the same node"})
        if nodes and self.kind != self.Kind.NETWORK:
            raise ValidationError({"kind": "a link between two nodes is a network link"})
        if devices or nodes:
            a, b = ("device_a", "device_b") if devices else ("node_a", "node_b")
            reverse = Link.objects.filter(**{a: getattr(self, f"{b}_id"), b: getattr(self, f"{a}_id")})
            if reverse.exclude(pk=self.pk).exists():
                raise ValidationError("a link between these two endpoints already exists")


class DeviceCalibration(models.Model):
    """How far a device's measured decode steps are from the planner's prediction, at one precision.

    Written only by ``calibration.device_calibration_observe`` from the stages' statistics (the fit,
    controlplane/telemetry/calibration.py): ``window`` keeps the newest observations, ``ratio`` is their
    median, and the planner uses it once the window holds ``MOTLEY_CALIBRATION_MIN_SAMPLES``
    (``calibration.calibrations``). Emulated and real devices are calibrated alike.
    """

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="calibrations")
    bits = models.PositiveSmallIntegerField(help_text="Precision of the measured stages' last layers.")
    ratio = models.FloatField(help_text="Median over the window of measured / predicted decode step time.")
    samples = models.PositiveIntegerField(help_text="Observations in the window.")
    window = models.JSONField(default=list, help_text="The newest observations: [time, ratio, stage].")
    announced_ratio = models.FloatField(null=True, blank=True, help_text="The ratio an event last announced.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["device", "-bits"]
        constraints = [
            models.UniqueConstraint(fields=["device", "bits"], name="calibration_unique_device_bits"),
        ]

    def __str__(self) -> str:
        return f"{self.device_id} at {self.bits} bits: x{self.ratio:.3g} ({self.samples} samples)"
