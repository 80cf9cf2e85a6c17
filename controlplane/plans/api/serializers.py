from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.deployments.models import Deployment
from controlplane.models_catalog.models import LlmModel


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1}, {"type": "string", "enum": ["auto"]}]})
class ReplicasField(serializers.Field):
    """A positive number of replicas, or "auto" (add replicas while total throughput rises)."""

    def to_internal_value(self, data):
        if data == "auto":
            return data
        if isinstance(data, int) and not isinstance(data, bool) and data >= 1:
            return data
        raise serializers.ValidationError('expected a positive integer or "auto"')

    def to_representation(self, value):
        return value


class PinSerializer(serializers.Serializer):
    device = serializers.CharField(help_text="<node>/gpu<i>")
    start = serializers.IntegerField(min_value=0)
    end = serializers.IntegerField(min_value=1)

    def validate(self, attrs):
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError("end must be greater than start (layers are [start, end))")
        return attrs


class PlanOptionsSerializer(serializers.Serializer):
    """A registered model, the workload and the operator's rules (a revision stores all but the model)."""

    model = serializers.PrimaryKeyRelatedField(queryset=LlmModel.objects.all())
    batch = serializers.IntegerField(min_value=1, default=8, help_text="Concurrent sequences per replica.")
    context = serializers.IntegerField(min_value=1, default=4096, help_text="Tokens each sequence may hold.")
    prompt_tokens = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    objective = serializers.ChoiceField(choices=["throughput", "latency"], default="throughput")
    bits = serializers.ListField(
        child=serializers.ChoiceField(choices=[16, 8, 4]), min_length=1, default=[16, 8, 4]
    )
    max_quantized = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.5)
    quality = serializers.JSONField(
        default=None, allow_null=True,
        help_text='The measured quality budget, {"max_kl": x}: the low-bit layers\' summed measured KL at '
                  "most x (needs manage.py profile_quality on the model); replaces max_quantized.",
    )
    replicas = ReplicasField(default="auto")
    pins = PinSerializer(many=True, default=list)
    exclude_nodes = serializers.ListField(child=serializers.CharField(), default=list)
    exclude_devices = serializers.ListField(child=serializers.CharField(), default=list)
    tensor_parallel = serializers.BooleanField(
        default=False, help_text="Also search stages split over a tensor-parallel group of one node's cards "
                                 "(docs/planner.md, \"Tensor-parallel groups\").")

    def validate(self, attrs):
        prompt = attrs.get("prompt_tokens")
        if prompt is not None and prompt > attrs["context"]:
            raise serializers.ValidationError({"prompt_tokens": "must not exceed context"})
        pins = attrs.get("pins")
        if pins is not None:
            attrs["pins"] = [dict(pin) for pin in pins]  # stored as plain JSON in a revision
        return attrs


class PlanRequestSerializer(PlanOptionsSerializer):
    """What to plan, and whether to keep the plan as a draft revision."""

    baseline = serializers.ChoiceField(
        choices=["even", "memory"], required=False, help_text="Plan with a baseline instead of the planner."
    )
    save = serializers.BooleanField(default=False, help_text="Store the plan as a draft revision (201).")
    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.all(), required=False, help_text="The deployment the draft is for."
    )


class PlanValidateSerializer(PlanOptionsSerializer):
    """An operator-edited plan (the planner's JSON, see docs/planner.md) and the request to judge it by."""

    plan = serializers.JSONField()
    deployment = serializers.PrimaryKeyRelatedField(
        queryset=Deployment.objects.all(), required=False,
        help_text="The deployment the plan is for: its speculation counts in the predicted tokens/s.")

    def validate_plan(self, value):
        if not isinstance(value, dict) or not isinstance(value.get("replicas"), list):
            raise serializers.ValidationError(
                'expected the planner\'s JSON: an object with a "replicas" list'
            )
        return value
