from __future__ import annotations

from typing import Any

from rest_framework import serializers

from controlplane.models_catalog.gguf_import import DTYPES
from controlplane.models_catalog.models import LlmModel


class LlmModelSerializer(serializers.ModelSerializer):
    url = serializers.HyperlinkedIdentityField(view_name="llmmodel-detail")

    class Meta:
        model = LlmModel
        fields = [
            "id", "url", "name", "path", "model_type", "num_layers", "hidden_size", "total_params",
            "torch_dtype", "has_weights", "has_tokenizer", "created", "last_updated",
        ]
        read_only_fields = fields


class LlmModelDetailSerializer(LlmModelSerializer):
    class Meta(LlmModelSerializer.Meta):
        fields = [*LlmModelSerializer.Meta.fields, "config", "quality"]
        read_only_fields = fields


class ModelRegisterSerializer(serializers.Serializer):
    """Either ``path`` (on the control plane's filesystem; a ``.gguf`` file is converted) or ``config``
    (a config.json body)."""

    path = serializers.CharField(
        required=False,
        help_text="Checkpoint directory, GGUF file (converted: docs/models.md) or config.json.",
    )
    config = serializers.JSONField(required=False, help_text="A Hugging Face config.json, for planning only.")
    name = serializers.CharField(required=False, max_length=200)
    dtype = serializers.ChoiceField(
        choices=DTYPES, required=False,
        help_text="GGUF only: the dtype its weights are stored in (default MOTLEY_MODEL_IMPORT_DTYPE).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("path" in attrs) == ("config" in attrs):
            raise serializers.ValidationError("give either path or config")
        return attrs
