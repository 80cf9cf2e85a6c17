"""The emulated memory budget sizes a stage by the shared footprint, precision by precision, and holds it
to the card's usable memory (the planner's reserve included)."""

from __future__ import annotations

import pytest

from agents.memory_budget import StageRefused, check_fits, spec_footprint
from contracts.footprint import RESERVED_BYTES, RESERVED_FRACTION, activation_workspace_bytes, usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_config import ModelConfig
from contracts.profiler import profile_model
from contracts.stage_spec import SpecError, StageSpec
from tests.agents.helpers import KV_BYTES_PER_TOKEN, TINY_LAYER_BYTES, stage_spec, tiny_model

T4 = DeviceSpec(name="box/gpu0", node="box", index=0, model="T4", memory_bytes=GIB,
                memory_bandwidth_gbs=320.0, fp16_tflops=65.0, bf16_tflops=65.0, int8_tops=130.0,
                emulated=True)


def footprint(raw: dict):
    """The agent's footprint of a spec as sent, parsed as the agent parses it where the task arrives."""
    return spec_footprint(StageSpec.from_dict(raw))


def test_a_stage_mixing_precisions_counts_each_layer_at_its_own(tmp_path):
    model = tiny_model(tmp_path / "model")
    profile = profile_model(ModelConfig.from_file(model), name="tiny")
    base = {**stage_spec(model, stage_index=1), "num_stages": 2, "layers": [1, 4], "next": None}
    mixed = footprint({**base, "low_bits": 4, "low_from": 3})
    layers, head = profile.layers, profile.head.weight_bytes
    assert mixed.weights_bytes == (layers[1].weight_bytes[16] + layers[2].weight_bytes[16]
                                   + layers[3].weight_bytes[4] + head[4])
    saved = layers[3].weight_bytes[16] - layers[3].weight_bytes[4] + head[16] - head[4]
    assert footprint(base).weights_bytes - mixed.weights_bytes == saved
    with pytest.raises(SpecError, match="strictly inside"):  # refused as the task arrives
        footprint({**base, "low_bits": 4, "low_from": 4})


def test_the_budget_counts_kv_workspace_and_the_batchs_logits_on_the_last_stage(tmp_path):
    model = tiny_model(tmp_path / "model")
    profile = profile_model(ModelConfig.from_file(model), name="tiny")
    middle = footprint({**stage_spec(model, stage_index=1), "kv_tokens": 1000, "batch": 4})
    assert (middle.weights_bytes, middle.kv_bytes) == (TINY_LAYER_BYTES, 1000 * KV_BYTES_PER_TOKEN)
    assert middle.workspace_bytes == activation_workspace_bytes(profile)
    last = footprint({**stage_spec(model, stage_index=1), "layers": [3, 4], "kv_tokens": 1000, "batch": 4})
    assert last.workspace_bytes == middle.workspace_bytes + 4 * 4 * profile.vocab_size  # fp32 logits x batch
    unbatched = footprint({**stage_spec(model, stage_index=1), "layers": [3, 4], "kv_tokens": 1000})
    # a spec without batch: 1
    assert last.workspace_bytes - unbatched.workspace_bytes == 3 * 4 * profile.vocab_size


def test_a_stage_fits_up_to_the_usable_memory_and_not_a_byte_beyond(tmp_path):
    need = footprint(stage_spec(tiny_model(tmp_path / "model"), memory_mib=100))
    usable = usable_bytes(T4)
    assert usable == int(GIB * (1 - RESERVED_FRACTION)) - RESERVED_BYTES
    check_fits(need, T4, used_bytes=usable - need.total_bytes)
    with pytest.raises(StageRefused) as refused:
        check_fits(need, T4, used_bytes=usable - need.total_bytes + 1)
    assert str(refused.value).startswith("does not fit on emulated box/gpu0 (T4, 1.00 GiB): needs 103.8 MiB "
                                         "(weights 1.3 MiB + KV 100.0 MiB + workspace 2.5 MiB) but ")
    assert "after the reserve" in str(refused.value)
