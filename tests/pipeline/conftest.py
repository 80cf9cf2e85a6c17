"""Fixtures of the pipeline tests: a tiny checkpoint made once, and stage processes that never outlive
their test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from worker_runtime.speculation import StepCost

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


@pytest.fixture
def latency_bound(monkeypatch):
    """The head's step cost fixed as a latency-bound pipeline's (hops between hosts: an extra position
    costs nothing), where the speculation policy proposes whatever may be accepted: in process the fit
    follows the CPU's noise, and a test of exactness needs proposals, not the policy's judgement."""
    monkeypatch.setattr(StepCost, "fit", lambda self: (0.05, 0.0))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")


@contextmanager
def launcher(model: Path, workdir: Path) -> Iterator[Callable[..., Pipeline]]:
    """``start(num_stages, **spec_overrides)`` -> a ready :class:`Pipeline`; all are stopped and checked on
    exit."""
    started: list[Pipeline] = []

    def start(num_stages: int = 3, **overrides) -> Pipeline:
        pipeline = Pipeline(pipeline_specs(model, NUM_LAYERS, num_stages, **overrides), workdir)
        started.append(pipeline)
        pipeline.ready_events = pipeline.wait_ready()
        return pipeline

    try:
        yield start
    finally:
        for pipeline in started:
            pipeline.stop()
        for pipeline in started:
            pipeline.assert_clean()


@pytest.fixture
def start_pipeline(tiny_model, tmp_path):
    with launcher(tiny_model, tmp_path) as start:
        yield start


@pytest.fixture(scope="module")
def shared_pipeline(tiny_model, tmp_path_factory) -> Iterator[Pipeline]:
    """Three stages with a 512-token KV budget each and prompt-lookup speculation, shared by the tests
    of a module that leave it clean."""
    with launcher(tiny_model, tmp_path_factory.mktemp("shared")) as start:
        yield start(3, kv_tokens=512, speculation="lookup")
