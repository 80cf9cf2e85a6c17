"""Registered LLMs: where the checkpoint lives, its architecture, and the profile the planner prices."""

from __future__ import annotations

from django.db import models

from controlplane.common.models import TimestampedModel


class LlmModel(TimestampedModel):
    """A LLaMA-family model, registered from a checkpoint directory or a bare config.json.

    ``config`` is the Hugging Face config as read; ``profile`` is ``ModelProfile.to_dict()``
    (see controlplane/modelspec). The architecture columns repeat a few of its figures so that
    lists can be filtered and shown without decoding either.
    """

    name = models.CharField(max_length=200, unique=True)
    path = models.CharField(
        max_length=1000,
        blank=True,
        help_text="Checkpoint directory on the control plane; empty when uploaded.",
    )
    config = models.JSONField()
    profile = models.JSONField()
    model_type = models.CharField(max_length=32)
    num_layers = models.PositiveIntegerField()
    hidden_size = models.PositiveIntegerField()
    total_params = models.BigIntegerField()
    torch_dtype = models.CharField(max_length=16)
    has_weights = models.BooleanField(
        help_text="The directory holds *.safetensors: the model can be deployed."
    )
    has_tokenizer = models.BooleanField(help_text="The directory holds tokenizer.json or tokenizer.model.")
    quality = models.JSONField(
        default=dict,
        blank=True,
        help_text="Measured by profile_quality: perplexities and per-layer KL at int8/int4; empty if never.",
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "LLM model"

    def __str__(self) -> str:
        return self.name
