from __future__ import annotations

from drf_spectacular.utils import extend_schema_field, extend_schema_serializer
from rest_framework import serializers

from contracts.routing import DEFAULT_ROUTING_STRATEGY
from contracts.stage_spec import MAX_SPECULATIVE_TOKENS, SPECULATION_MODES
from controlplane.deployments.degrade import degraded_workload
from controlplane.deployments.models import (
    ROUTING_STRATEGY_CHOICES,
    Deployment,
    DeploymentPipeline,
    DeploymentStage,
    PlanRevision,
)
from controlplane.deployments.targets import MAX_WINDOW_S, MIN_WINDOW_S, PERCENTILE_CHOICES, TARGET_FIELDS
from controlplane.models_catalog.models import LlmModel

# Deprecated aliases of renamed fields, kept in responses with the values they always had; they go away
# in a later release (docs/api.md, "Deprecated fields").
DEPRECATED_PIPELINE = ("Deprecated: use `pipeline` (the physical pipeline's index); "
                       "removed in a later release.")
DEPRECATED_PLAN_REPLICA = ("Deprecated: use `plan_replica` (the plan replica served, `plan.replicas[i]`); "
                           "removed in a later release.")


@extend_schema_serializer(deprecate_fields=["replica", "slot"])
class StageSerializer(serializers.ModelSerializer):
    """A stage's place and observed state; the spec's auth token is never shown. ``pipeline`` is the
    index of its physical pipeline (the ``r`` of its stage key), ``plan_replica`` the plan replica that
    pipeline serves; ``replica`` and ``slot`` are their deprecated names."""

    stage_key = serializers.CharField(read_only=True)
    replica = serializers.IntegerField(source="pipeline", read_only=True, help_text=DEPRECATED_PIPELINE)
    slot = serializers.IntegerField(source="plan_replica", read_only=True, help_text=DEPRECATED_PLAN_REPLICA)
    node_name = serializers.CharField(source="node.name", read_only=True)
    device_name = serializers.CharField(source="device.name", read_only=True, default=None)
    address = serializers.CharField(source="spec.listen", read_only=True, default=None)
    layers = serializers.JSONField(source="spec.layers", read_only=True, default=None)
    bits = serializers.IntegerField(source="spec.bits", read_only=True, default=None)
    low_bits = serializers.IntegerField(source="spec.low_bits", read_only=True, default=None)
    low_from = serializers.IntegerField(source="spec.low_from", read_only=True, default=None)
    tensor_group = serializers.JSONField(
        source="spec.tensor_group", read_only=True, default=list,
        help_text="A tensor-parallel stage's ranks, the first on ``device`` (docs/contracts.md §1); [] for "
                  "one card.")

    class Meta:
        model = DeploymentStage
        fields = [
            "stage_key", "pipeline", "plan_replica", "stage_index", "wanted", "held", "node", "node_name",
            "device", "device_name", "address", "layers", "bits", "low_bits", "low_from", "tensor_group",
            "state", "pid", "exit_code", "restarts", "message", "observed_at", "replica", "slot",
        ]


@extend_schema_serializer(deprecate_fields=["slot"])
class PipelineSerializer(serializers.ModelSerializer):
    """One pipeline of the deployment and where it is in a handover (its auth token is never shown):
    a change of placement is done when every pipeline is ``serving``. ``plan_replica`` is the plan
    replica it serves; ``slot`` its deprecated name."""

    pipeline_id = serializers.CharField(read_only=True)
    slot = serializers.IntegerField(source="plan_replica", read_only=True, help_text=DEPRECATED_PLAN_REPLICA)

    class Meta:
        model = DeploymentPipeline
        fields = ["pipeline_id", "index", "plan_replica", "phase", "phase_since", "slot"]


class PlanRevisionSerializer(serializers.ModelSerializer):
    class Meta:
        model = PlanRevision
        fields = [
            "id", "number", "model", "deployment", "source", "status", "plan", "request", "degraded_from",
            "created", "applied_at",
        ]
        extra_kwargs = {"degraded_from": {"help_text": "The request a degraded revision stands in for (a "
                                          "re-plan after a loss that fit only a smaller workload or lower "
                                          "precision); null for a full plan."}}


class DeploymentSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="deployment-detail")
    model_name = serializers.CharField(source="model.name", read_only=True)
    revision_number = serializers.IntegerField(source="revision.number", read_only=True, default=None)
    draft_deployment_name = serializers.CharField(source="draft_deployment.name", read_only=True,
                                                  default=None)
    stages = serializers.SerializerMethodField(
        help_text="Wanted stages first; stages still being stopped after a move follow.")
    pipelines = PipelineSerializer(many=True, read_only=True)
    degraded = serializers.SerializerMethodField(
        help_text="The applied plan's workload against the one asked, when a re-plan after a loss could fit "
                  "only fewer or shorter sequences, and the precision it lowered on the emergency quality "
                  "budget (null: the full plan).")

    class Meta:
        model = Deployment
        fields = [
            "id", "url", "name", "model", "model_name", "revision", "revision_number", "replan_on_failure",
            "routing_strategy", "rebalance_policy", "prefix_caching", "speculation", "speculative_tokens",
            "draft_deployment", "draft_deployment_name", *TARGET_FIELDS, "status", "status_message",
            "degraded", "stop_requested", "stages", "pipelines", "created", "last_updated",
        ]

    @extend_schema_field(serializers.JSONField(allow_null=True))
    def get_degraded(self, deployment: Deployment) -> dict | None:
        return degraded_workload(deployment.revision) if deployment.revision else None

    @extend_schema_field(StageSerializer(many=True))
    def get_stages(self, deployment: Deployment) -> list[dict]:
        """Wanted stages first; stages still being stopped after a move follow."""
        return StageSerializer(deployment.stages.all(), many=True).data


# The sources an operator may give a plan (replan and drain revisions are the controller's own);
# named in SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"] so the schema's two "source" enums differ.
PLAN_INPUT_SOURCES = [
    (source.value, source.label) for source in (PlanRevision.Source.PLANNER, PlanRevision.Source.EDITED)
]


class PlanInputSerializer(serializers.Serializer):
    """Either an existing draft revision or a plan (with the request it answers) to store as one."""

    revision = serializers.PrimaryKeyRelatedField(
        queryset=PlanRevision.objects.filter(status=PlanRevision.Status.DRAFT), required=False
    )
    plan = serializers.JSONField(required=False)
    request = serializers.JSONField(required=False, default=dict)
    source = serializers.ChoiceField(choices=PLAN_INPUT_SOURCES, default=PlanRevision.Source.PLANNER)

    def validate(self, attrs):
        if ("revision" in attrs) == ("plan" in attrs):
            raise serializers.ValidationError("give either revision (a draft plan revision's id) or plan")
        return attrs


class TargetsSerializer(serializers.Serializer):
    """The service-level targets (docs/deployments.md, "Service-level targets and demand");
    ``targets_check`` in the service checks them together (least replicas at most the most)."""

    ttft_target_ms = serializers.IntegerField(min_value=1, allow_null=True, required=False,
                                              help_text="Time to first token, ms (null: no target).")
    tpot_target_ms = serializers.IntegerField(min_value=1, allow_null=True, required=False,
                                              help_text="Time per output token after the first, ms (null: "
                                              "no target).")
    target_percentile = serializers.ChoiceField(choices=PERCENTILE_CHOICES, required=False)
    target_window_s = serializers.IntegerField(min_value=MIN_WINDOW_S, max_value=MAX_WINDOW_S, required=False)
    priority = serializers.IntegerField(required=False, help_text="Higher is served first.")
    min_replicas = serializers.IntegerField(min_value=1, max_value=32767, required=False)
    max_replicas = serializers.IntegerField(min_value=1, max_value=32767, allow_null=True, required=False,
                                            help_text="null: as many as the fleet holds.")
    emergency_max_kl = serializers.FloatField(
        allow_null=True, required=False,
        help_text="The summed measured KL of the layers a re-plan after a loss may lower to keep serving "
        "when not even its smallest workload fits (positive; needs manage.py profile_quality; null: none).")

    def targets(self) -> dict:
        """The validated target fields that were given."""
        return {name: self.validated_data[name] for name in TARGET_FIELDS if name in self.validated_data}


class DeploymentCreateSerializer(PlanInputSerializer, TargetsSerializer):
    name = serializers.RegexField(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    model = serializers.PrimaryKeyRelatedField(queryset=LlmModel.objects.all(), required=False)
    replan_on_failure = serializers.BooleanField(default=True)
    routing_strategy = serializers.ChoiceField(choices=ROUTING_STRATEGY_CHOICES,
                                               default=DEFAULT_ROUTING_STRATEGY)
    prefix_caching = serializers.BooleanField(default=True)
    speculation = serializers.ChoiceField(choices=SPECULATION_MODES, default="off")
    speculative_tokens = serializers.IntegerField(min_value=1, max_value=MAX_SPECULATIVE_TOKENS, default=4)
    draft_model = serializers.PrimaryKeyRelatedField(
        queryset=LlmModel.objects.all(), required=False, default=None,
        help_text='With speculation "draft": the model that proposes tokens, deployed where the planner '
        "places it (a smaller model sharing the tokenizer).")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if "plan" in attrs and "model" not in attrs:
            raise serializers.ValidationError({"model": "required with a plan"})
        return attrs


class DeploymentUpdateSerializer(TargetsSerializer):
    """What a PATCH may change without a new plan."""

    routing_strategy = serializers.ChoiceField(choices=ROUTING_STRATEGY_CHOICES, required=False)
    replan_on_failure = serializers.BooleanField(required=False)
    rebalance_policy = serializers.ChoiceField(choices=Deployment.RebalancePolicy.choices, required=False)
    prefix_caching = serializers.BooleanField(required=False)
    speculation = serializers.ChoiceField(choices=SPECULATION_MODES, required=False)
    speculative_tokens = serializers.IntegerField(min_value=1, max_value=MAX_SPECULATIVE_TOKENS,
                                                  required=False)
    draft_model = serializers.PrimaryKeyRelatedField(
        queryset=LlmModel.objects.all(), required=False,
        help_text='With speculation "draft": the model that proposes tokens (another one replaces the '
        "draft deployment).")

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                f"cannot change {', '.join(unknown)} here; a new plan goes through apply/, "
                f"only {', '.join(self.fields)} may be patched"
            )
        return attrs
