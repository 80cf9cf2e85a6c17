"""Deployments: the desired state (a plan revision) and the observed state (what each stage reports).

Desired state is written only through the services the API calls; observed state only by the agents
(through the websocket consumer) and the controller. ``reconcile`` compares the two.
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from contracts.names import pipeline_id, stage_key
from contracts.routing import DEFAULT_ROUTING_STRATEGY, ROUTING_STRATEGIES
from contracts.stage_spec import MAX_SPECULATIVE_TOKENS, SPECULATION_MODES
from controlplane.common.models import TimestampedModel
from controlplane.deployments.targets import (
    DEFAULT_PERCENTILE,
    DEFAULT_WINDOW_S,
    PERCENTILE_CHOICES,
    PERCENTILES,
    targets_check,
    targets_of,
)
from controlplane.inventory.models import Device, Node
from controlplane.models_catalog.models import LlmModel
from controlplane.planning import Placement, Plan, replica_placements, stored_plan

# The gateway router's strategies (contracts/routing.py), e.g. "round_robin".
ROUTING_STRATEGY_CHOICES = [(name, name.replace("_", "-")) for name in ROUTING_STRATEGIES]


class PlanRevision(TimestampedModel):
    """One plan for one model, as the planner or an operator wrote it; immutable once applied."""

    class Status(models.TextChoices):
        DRAFT = "draft", "Draft"
        APPLIED = "applied", "Applied"  # the desired state of its deployment
        SUPERSEDED = "superseded", "Superseded"  # was applied, replaced by a later revision

    class Source(models.TextChoices):
        PLANNER = "planner", "Planner"
        EDITED = "edited", "Edited by an operator"
        REPLAN = "replan", "Re-planned after a failure"
        DRAIN = "drain", "Re-planned to drain a node"
        REBALANCE = "rebalance", "Proposed by the rebalance policy"

    model = models.ForeignKey(LlmModel, on_delete=models.PROTECT, related_name="plan_revisions")
    deployment = models.ForeignKey(
        "Deployment", null=True, blank=True, on_delete=models.CASCADE, related_name="revisions"
    )
    number = models.PositiveIntegerField(null=True, blank=True, help_text="1, 2, … within its deployment.")
    plan = models.JSONField(help_text="The plan as docs/planner.md describes it.")
    request = models.JSONField(help_text="Workload and operator rules the plan was made for (no fleet).")
    degraded_from = models.JSONField(
        null=True, blank=True,
        help_text="The request this revision's smaller workload stands in for, when the fleet could not fit "
                  "it (a re-plan after a loss: degrade.py); the reconcile loop restores it once it fits.")
    source = models.CharField(max_length=16, choices=Source.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    applied_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "number"], name="plan_revision_unique_number"),
        ]

    def __str__(self) -> str:
        return f"plan revision {self.pk} of {self.model}"

    @property
    def priced(self) -> Plan | None:
        """``plan`` parsed into the planner's ``Plan`` (its figures, bottleneck, explanation); None for a
        plan that holds only what an operator edits, priced when it is checked (``plan_revision_check``)."""
        return stored_plan(self.plan)

    @property
    def placements(self) -> tuple[tuple[Placement, ...], ...]:
        """Each replica's stages as ``plan`` places them (device, layers, precision): every stored plan
        has them. PlanningError names what is wrong with a malformed one."""
        return replica_placements(self.plan)


class Deployment(TimestampedModel):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        DEPLOYING = "deploying", "Deploying"
        READY = "ready", "Ready"
        DEGRADED = "degraded", "Degraded"
        FAILED = "failed", "Failed"
        STOPPED = "stopped", "Stopped"

    class RebalancePolicy(models.TextChoices):
        """What the rebalance policy (controlplane/rebalance/) does with a better plan."""

        OFF = "off", "Off: never evaluated"
        PROPOSE = "propose", "Propose: an operator accepts or dismisses"
        AUTO = "auto", "Auto: applied at once"

    name = models.CharField(max_length=100, unique=True)
    model = models.ForeignKey(LlmModel, on_delete=models.PROTECT, related_name="deployments")
    revision = models.ForeignKey(
        PlanRevision, null=True, on_delete=models.PROTECT, related_name="+", help_text="The desired plan."
    )
    replan_on_failure = models.BooleanField(
        default=True, help_text="Re-plan on the healthy devices when a node carrying a stage is lost."
    )
    routing_strategy = models.CharField(
        max_length=32, choices=ROUTING_STRATEGY_CHOICES, default=DEFAULT_ROUTING_STRATEGY,
        help_text="How the gateway chooses among the pipelines (docs/gateway.md).",
    )
    prefix_caching = models.BooleanField(
        default=True, help_text="Stages keep the KV of full prompt blocks and reuse it for a request that "
        "starts with the same tokens (docs/deployments.md, \"Prefix caching\").",
    )
    speculation = models.CharField(
        max_length=16, choices=[(mode, mode) for mode in SPECULATION_MODES], default="off",
        help_text="How the head proposes tokens that every stage verifies in one pass, or off "
        "(docs/deployments.md, \"Speculative decoding\").",
    )
    speculative_tokens = models.PositiveSmallIntegerField(
        default=4, validators=[MinValueValidator(1), MaxValueValidator(MAX_SPECULATIVE_TOKENS)],
        help_text="The most tokens proposed per sequence and step (the adaptive count's ceiling).",
    )
    draft_deployment = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="drafting_for",
        help_text="With speculation \"draft\": the deployment serving the draft model that proposes "
        "tokens (docs/deployments.md, \"Draft model\").",
    )
    rebalance_policy = models.CharField(
        max_length=16, choices=RebalancePolicy.choices, default=RebalancePolicy.PROPOSE,
        help_text="What the rebalance policy does when a better plan exists (docs/deployments.md).",
    )
    # Service-level targets (targets.py, docs/deployments.md "Service-level targets"); null: none set.
    ttft_target_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="Time to first token its requests should see, in milliseconds.")
    tpot_target_ms = models.PositiveIntegerField(
        null=True, blank=True, help_text="Time per output token after the first, in milliseconds.")
    target_percentile = models.PositiveSmallIntegerField(
        choices=PERCENTILE_CHOICES, default=DEFAULT_PERCENTILE,
        help_text="The share of requests of a window that must meet the targets.")
    target_window_s = models.PositiveIntegerField(
        default=DEFAULT_WINDOW_S, help_text="The window, in seconds, the percentile is measured over.")
    priority = models.IntegerField(default=0, help_text="Higher is served first when deployments compete "
                                   "for cards.")
    min_replicas = models.PositiveSmallIntegerField(default=1, help_text="The fewest replicas it keeps.")
    max_replicas = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="The most replicas it may grow to (null: what the fleet holds).")
    emergency_max_kl = models.FloatField(
        null=True, blank=True, help_text="When a lost card leaves no room at the plan's precision: the "
        "summed measured KL of the layers it may lower to keep serving (null: no lower precision).")
    stop_requested = models.BooleanField(default=False)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_message = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_replicas__isnull=True) | Q(max_replicas__gte=models.F("min_replicas")),
                name="deployment_replicas_least_le_most"),
            models.CheckConstraint(condition=Q(target_percentile__in=PERCENTILES),
                                   name="deployment_target_percentile"),
            models.CheckConstraint(condition=Q(emergency_max_kl__isnull=True) | Q(emergency_max_kl__gt=0),
                                   name="deployment_emergency_max_kl_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        targets_check(targets_of(self), model=self.model)


class DeploymentPipeline(models.Model):
    """One physical pipeline of a deployment; its auth token is shared by its stages and the gateway only.

    ``index`` names the pipeline (``d<dep>-r<index>``, its stage keys) for its whole life; ``plan_replica``
    is the plan replica it serves (``revision.priced.replicas[plan_replica]``). They differ after a
    handover: a changed replica may be served by a new pipeline started beside the old one (handover.py,
    docs/deployments.md "Handover (make before break)"), and ``phase`` says where each pipeline is in that.
    """

    class Phase(models.TextChoices):
        SERVING = "serving", "Serving"
        INCOMING = "incoming", "Incoming"  # started beside its replica's serving pipeline; not served yet
        OUTGOING = "outgoing", "Outgoing"  # replaced: finishes its in-flight requests, then stopped
        RELOADING = "reloading", "Reloading"  # its changed stages restart in place; not served meanwhile

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="pipelines")
    index = models.PositiveSmallIntegerField()
    auth_token = models.CharField(max_length=64)
    plan_replica = models.PositiveSmallIntegerField(default=0)
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.SERVING)
    phase_since = models.DateTimeField(default=timezone.now)
    # The handover that made an outgoing pipeline outgoing: when it was decided (the revision applied),
    # when its replica switched away from it, when its head was told to stop, and when the rest were.
    handover_started_at = models.DateTimeField(null=True, blank=True)
    switched_at = models.DateTimeField(null=True, blank=True)
    head_stopped_at = models.DateTimeField(null=True, blank=True)
    drained_at = models.DateTimeField(null=True, blank=True)  # its head exited (or the drain bound passed)

    class Meta:
        ordering = ["deployment", "index"]
        constraints = [models.UniqueConstraint(fields=["deployment", "index"], name="pipeline_unique_index")]

    @property
    def pipeline_id(self) -> str:
        return pipeline_id(self.deployment_id, self.index)

    def stages(self) -> models.QuerySet[DeploymentStage]:
        """Its wanted stage rows, in pipeline order."""
        return DeploymentStage.objects.filter(deployment_id=self.deployment_id, pipeline=self.index,
                                              wanted=True).select_related("node").order_by("stage_index")

    def held_stages(self) -> models.QuerySet[DeploymentStage]:
        """Its stages started beside it ahead of a prepared in-place handover (``DeploymentStage.held``)."""
        return DeploymentStage.objects.filter(deployment_id=self.deployment_id, pipeline=self.index,
                                              held=True).select_related("node").order_by("stage_index")


class DeploymentStage(models.Model):
    """One stage process: where it must run with what spec (desired) and what its agent reports.

    A stage that moves to another node leaves its old row behind with ``wanted=False`` until the old
    node confirms it stopped (or is lost), so nothing keeps running unseen. A ``held`` row is the
    other way round: a stage started on its new node beside the pipeline it will join, ahead of an
    in-place handover (handover.py, "prepared"), not wanted by the pipeline yet; its spec says
    ``hold`` and ``next_spec`` is what it runs once the handover releases it. A wanted row's
    ``next_spec`` is the spec it takes at that release.
    """

    class State(models.TextChoices):
        PENDING = "pending", "Pending"  # start sent (or to be sent); the agent has not reported it yet
        STARTING = "starting", "Starting"
        READY = "ready", "Ready"
        DRAINING = "draining", "Draining"
        EXITED = "exited", "Exited"
        FAILED = "failed", "Failed"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="stages")
    pipeline = models.PositiveSmallIntegerField()  # the physical pipeline's index (its stage key)
    # Its pipeline's plan replica (DeploymentPipeline.plan_replica, fixed for the pipeline's life): where
    # its predictions are in the plan, ``revision.priced.replicas[plan_replica].stages[stage_index]``.
    plan_replica = models.PositiveSmallIntegerField(default=0)
    stage_index = models.PositiveSmallIntegerField()
    wanted = models.BooleanField(default=True)
    held = models.BooleanField(default=False)
    next_spec = models.JSONField(null=True, blank=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="stages")
    device = models.ForeignKey(Device, null=True, on_delete=models.SET_NULL, related_name="stages")
    port = models.PositiveIntegerField()
    spec = models.JSONField(help_text="The stage spec (docs/contracts.md §1) the agent is asked to run.")
    # Desired spec last sent to the node, and to which of its incarnations.
    sent_spec = models.JSONField(null=True, blank=True)
    sent_incarnation = models.PositiveIntegerField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    # Where the process the last start asked for runs: an in-place re-plan rewrites ``device`` before
    # that process is replaced, and until then it holds memory here (reconcile's room test).
    sent_device = models.ForeignKey(Device, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    stop_sent_at = models.DateTimeField(null=True, blank=True)
    # Observed, from the agent's StageStatus.
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    pid = models.PositiveIntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    message = models.TextField(blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["deployment", "pipeline", "stage_index", "-wanted"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "pipeline", "stage_index"], condition=Q(wanted=True),
                name="stage_unique_wanted",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stage_key} on {self.node_id}"

    def reference_label(self) -> str:
        """How the stage is named when it keeps its node from being deleted (common/errors.py)."""
        return f"deployment {self.deployment.name} (stage r{self.pipeline}-s{self.stage_index})"

    @property
    def stage_key(self) -> str:
        return stage_key(self.deployment_id, self.pipeline, self.stage_index)

    @property
    def lost(self) -> bool:
        """Its node is LOST, or its device disappeared (the agent re-registered without it): it cannot run."""
        return self.node.status == Node.Status.LOST or self.device_id is None


class DeploymentEvent(models.Model):
    """Something that happened to a deployment or a node, recorded once when it happened.

    Written only through ``events.event_record`` at a real transition (a status that changed, a
    revision applied, a node that turned SUSPECT or LOST or came back), never per heartbeat or per
    reconcile pass; read by the dashboard and ``GET /api/v1/events/``. Nodes and devices are kept by
    name, so an event outlives the row it names.
    """

    class Kind(models.TextChoices):
        APPLIED = "applied", "Plan applied"  # a deployment created, or an operator's apply
        REPLANNED = "replanned", "Re-planned after a lost node"
        DRAINED = "drained", "Re-planned to drain a node"
        REPLAN_FAILED = "replan_failed", "Re-plan failed"
        READY = "ready", "Ready"
        DEGRADED = "degraded", "Degraded"
        FAILED = "failed", "Failed"
        STOPPING = "stopping", "Stop requested"
        STOPPED = "stopped", "Stopped"
        NODE_REGISTERED = "node_registered", "Agent registered"
        NODE_SUSPECT = "node_suspect", "Node suspect"
        NODE_LOST = "node_lost", "Node lost"
        NODE_BACK = "node_back", "Node back"
        NODE_CORDONED = "node_cordoned", "Node cordoned"  # an operator: no new stages on it
        NODE_UNCORDONED = "node_uncordoned", "Node uncordoned"
        NODE_DRAINING = "node_draining", "Node draining"
        NODE_UNDRAINED = "node_undrained", "Node undrained"
        CALIBRATED = "calibrated", "Calibrated"  # the planner's costs from measured step times
        THROTTLED = "throttled", "Throttled"  # a device slowed by its clocks, power or temperature
        POLICY = "policy", "Policy decision"  # what an automatic policy decided and why
        HANDOVER_STARTED = "handover_started", "Handover started"  # a changed replica: beside or in place
        HANDOVER_SWITCHED = "handover_switched", "Handover switched"  # the new pipeline serves the replica
        HANDOVER_DRAINED = "handover_drained", "Handover drained"  # the old pipeline is stopped
        HANDOVER_DONE = "handover_done", "Handover done"
        DEGRADED_PLAN = "degraded_plan", "Serving a degraded plan"  # fewer or shorter sequences than asked
        RESTORED = "restored", "Full plan restored"

    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    node = models.CharField(max_length=100, null=True, blank=True,
                            help_text="Node name, if one is concerned.")
    device = models.CharField(max_length=200, null=True, blank=True, help_text='Device name "<node>/gpu<i>".')
    message = models.TextField()
    detail = models.JSONField(default=dict, blank=True, help_text="A few figures or names, kind by kind.")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["deployment", "-at"], name="event_deployment_at"),
            models.Index(fields=["at"], name="event_at"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"
