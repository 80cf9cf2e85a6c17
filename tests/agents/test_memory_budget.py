"""The emulated memory budget sizes a stage as the planner does, precision by precision."""

from __future__ import annotations

import pytest

from agents.memory_budget import StageRefused, stage_bytes
from contracts.model_config import ModelConfig
from contracts.profiler import profile_model
from tests.agents.helpers import stage_spec, tiny_model


def test_a_stage_mixing_precisions_counts_each_layer_at_its_own(tmp_path):
    model = tiny_model(tmp_path / "model")
    profile = profile_model(ModelConfig.from_file(model), name="tiny")
    base = {**stage_spec(model, stage_index=1), "num_stages": 2, "layers": [1, 4]}
    mixed = stage_bytes({**base, "low_bits": 4, "low_from": 3})
    layers, head = profile.layers, profile.head.weight_bytes
    assert mixed.weight_bytes == (layers[1].weight_bytes[16] + layers[2].weight_bytes[16]
                                  + layers[3].weight_bytes[4] + head[4])
    saved = layers[3].weight_bytes[16] - layers[3].weight_bytes[4] + head[16] - head[4]
    assert stage_bytes(base).weight_bytes - mixed.weight_bytes == saved
    with pytest.raises(StageRefused, match="strictly inside"):
        stage_bytes({**base, "low_bits": 4, "low_from": 4})
