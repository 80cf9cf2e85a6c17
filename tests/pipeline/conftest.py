"""Fixtures of the pipeline tests: a tiny checkpoint made once, and stage processes that never outlive a test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .harness import Pipeline, pipeline_specs

NUM_LAYERS = 6


def make_tiny_llama(out: Path, num_layers: int = NUM_LAYERS, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=num_layers,
        vocab_size=256,
        max_position_embeddings=512,
        initializer_range=0.1,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def start_pipeline(tiny_model, tmp_path):
    """``start_pipeline(num_stages, **spec_overrides)`` -> a ready :class:`Pipeline`; killed at teardown."""
    started: list[Pipeline] = []

    def start(num_stages: int = 3, **overrides) -> Pipeline:
        pipeline = Pipeline(pipeline_specs(tiny_model, NUM_LAYERS, num_stages, **overrides), tmp_path)
        started.append(pipeline)
        pipeline.wait_ready()
        return pipeline

    yield start
    for pipeline in started:
        pipeline.stop()
        pipeline.assert_clean()

