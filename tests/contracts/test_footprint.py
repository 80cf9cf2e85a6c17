"""One stage footprint (contracts.footprint) for the planner, the agent and the worker: the formula by
hand, then the three sides computing the same bytes for the same stage."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agents.memory_budget import spec_footprint
from contracts.footprint import (
    RESERVED_BYTES,
    RESERVED_FRACTION,
    UNBOUNDED_KV_TOKENS,
    stage_footprint,
    usable_bytes,
)
from contracts.hardware import GIB
from contracts.model_config import ModelConfig
from contracts.precision import Precision
from contracts.profiler import profile_model
from contracts.stage_spec import StageSpec
from controlplane.planning import PlanRequest, Workload
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from tests.planning.factories import fleet, profile

CONFIG = {
    "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 12, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 640, "vocab_size": 1000, "torch_dtype": "bfloat16",
}
# (start, end, bits, low_bits, low_from) of a 12-layer model: first, middle, last, mixed, whole.
STAGES = [
    (0, 3, 16, None, None), (0, 4, 16, 8, 2), (3, 7, 8, None, None), (4, 9, 16, 4, 6),
    (7, 12, 16, None, None),
    (9, 12, 16, 4, 10), (8, 12, 4, None, None), (0, 12, 16, 8, 6), (0, 12, 4, None, None),
]


def test_the_formula_by_hand():
    model = profile(6, hidden=512, layer_params=1_000_000, vocab=3000, kv_bytes=4096)
    layer, embedding, head = (model.layers[0].weight_bytes, model.embedding.weight_bytes,
                              model.head.weight_bytes)
    whole = stage_footprint(model, 0, 6, Precision(16, 4, 4), kv_tokens=100, batch=3)
    assert whole.weights_bytes == embedding[16] + 4 * layer[16] + 2 * layer[4] + head[4]
    assert (whole.kv_bytes_per_token, whole.kv_bytes) == (6 * 4096, 100 * 6 * 4096)
    chunk = 512 * model.activation_bytes_per_token * 10  # a prefill chunk's activations
    assert whole.workspace_bytes == chunk + 4 * 3000 * 3  # + fp32 logits of 3 sequences
    assert whole.total_bytes == whole.weights_bytes + whole.kv_bytes + whole.workspace_bytes
    middle = stage_footprint(model, 2, 4, Precision(8), kv_tokens=10, batch=3)
    assert (middle.weights_bytes, middle.workspace_bytes) == (2 * layer[8], chunk)
    assert middle.holding(11) == middle.total_bytes + 2 * 4096
    assert middle.kv_tokens_within(middle.total_bytes) == 10
    assert middle.kv_tokens_within(middle.total_bytes - 1) == 9
    assert middle.kv_tokens_within(chunk) == 0
    # The host tier is host memory: counted apart, never in what the device holds.
    tiered = stage_footprint(model, 2, 4, Precision(8), kv_tokens=10, host_kv_tokens=300, batch=3)
    assert (tiered.host_kv_bytes, tiered.total_bytes) == (300 * 2 * 4096, middle.total_bytes)
    assert middle.host_kv_bytes == 0
    device = fleet({"n": ["T4"]}).devices[0]
    assert usable_bytes(device) == int(16 * GIB * (1 - RESERVED_FRACTION)) - RESERVED_BYTES
    assert usable_bytes(replace(device, memory_used_bytes=GIB)) == usable_bytes(device) - GIB
    with pytest.raises(ValueError, match="strictly inside"):
        stage_footprint(model, 2, 4, Precision(16, 4, 4), batch=1)
    with pytest.raises(ValueError, match="6-layer model"):
        stage_footprint(model, 2, 7, batch=1)


def test_a_stage_whose_layers_cache_nothing_has_unbounded_kv_room():
    model = profile(2, kv_bytes=0)
    footprint = stage_footprint(model, 0, 1, batch=1)
    assert footprint.kv_tokens_within(footprint.total_bytes) == UNBOUNDED_KV_TOKENS
    assert footprint.kv_tokens_within(footprint.total_bytes - 1) == 0


def test_the_planner_and_the_agent_compute_the_same_footprint_of_a_stage(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    model = profile_model(ModelConfig.from_file(tmp_path), name=str(tmp_path))
    request = PlanRequest(fleet({"n": ["A100", "T4"]}), model, Workload(batch=5, context=256))
    cost = CostModel(request)
    t4 = request.fleet.device("n/gpu1")
    for start, end, bits, low_bits, low_from in STAGES:
        placement = Placement(t4.name, start, end, bits, low_bits, low_from)
        planner = cost.memory(t4, placement)
        spec = StageSpec(pipeline_id="d1-r0", auth_token="t", model_path=str(tmp_path),
                         stage_index=0 if start == 0 else 1, num_stages=3, layers=(start, end),
                         listen="tcp://127.0.0.1:1", head="tcp://127.0.0.1:1", next="tcp://127.0.0.1:2",
                         **Precision(bits, low_bits, low_from).fields(), kv_tokens=planner.kv_tokens, batch=5)
        agent = spec_footprint(spec)
        assert (agent.weights_bytes, agent.kv_bytes_per_token, agent.workspace_bytes) == (
            planner.weights_bytes, planner.kv_bytes_per_token, planner.workspace_bytes), placement
        assert agent.total_bytes == planner.holding(planner.kv_tokens) <= planner.capacity_bytes
        assert planner.capacity_bytes == usable_bytes(t4)
        # The price matrices' memory bound is the same sum for the workload's KV.
        kept = cost._kept_bytes(np.array(start), np.array(placement.split), np.array(end), bits,
                                placement.last_bits)
        assert float(kept) == agent.holding(cost.kv_required)


def test_the_planners_matrices_hold_every_range_to_the_footprint():
    """The partition search prices every [i, j) from prefix sums; on layers of different sizes they
    give exactly the footprint's bytes for every range, precision and split."""
    sizes = [150_000_000 + 7_000_000 * i for i in range(9)]
    model = profile(9, hidden=1024, sizes=sizes, vocab=5000)
    request = PlanRequest(fleet({"n": ["A100"]}), model, Workload(batch=3, context=512))
    cost = CostModel(request)
    n = model.num_layers
    for bits, low_bits in ((16, 16), (8, 8), (4, 4), (16, 8), (16, 4), (8, 4)):
        for start in range(n):
            for end in range(start + 1, n + 1):
                splits = [end] if bits == low_bits else range(start + 1, end)
                for split in splits:
                    stage = (start, end, bits) if split == end else (start, end, bits, low_bits, split)
                    footprint = stage_footprint(model, start, end, Precision(*stage[2:]), batch=3)
                    want = footprint.holding(cost.kv_required)
                    got = cost._kept_bytes(np.array(start), np.array(split), np.array(end), bits, low_bits)
                    assert float(got) == want, stage


# Stages of an L-layer checkpoint: (start, end, bits, low_bits, low_from) from L.
WORKER_STAGES = {
    "first": lambda L: (0, 1, 16, None, None),
    "middle int8": lambda L: (1, L - 1, 8, None, None),
    "last mixed": lambda L: (1, L, 16, 4, L - 1),
    "whole int4": lambda L: (0, L, 4, None, None),
    "last int8": lambda L: (L - 1, L, 8, None, None),
}


@pytest.mark.parametrize("variant", ["llama_gqa_llama3", "llama_linear_bias", "qwen2_bias"])
@pytest.mark.parametrize("which", list(WORKER_STAGES))
def test_a_loaded_stage_holds_the_footprints_weights_and_kv(tmp_path, variant, which):
    """The worker's real bytes equal the footprint's (a 16-bit stage, so norms, biases and the
    embedding are 16-bit as profiled; an untied head, which the profile counts as its own matrix)."""
    torch = pytest.importorskip("torch")
    from tests.worker_runtime.checkpoints import make_checkpoint
    from worker_runtime import Stage

    path = make_checkpoint(variant, tmp_path / variant)
    config = ModelConfig.from_file(path)
    start, end, bits, low_bits, low_from = WORKER_STAGES[which](config.num_layers)
    precision = Precision(bits, low_bits, low_from)
    footprint = stage_footprint(profile_model(config, name=variant), start, end, precision, kv_tokens=64,
                                batch=1)
    stage = Stage.load(path, start, end, dtype=torch.bfloat16, precision=precision, kv_tokens=64)
    real = stage.memory()
    assert real.weight_bytes == footprint.weights_bytes
    assert real.kv_bytes_per_token == footprint.kv_bytes_per_token


@pytest.mark.parametrize("hidden", [256, 80], ids=["groups of 32", "per row"])
def test_the_int8_head_is_priced_as_the_stage_holds_it(hidden):
    """The int8 lm_head has a scale per 32 weights of a row where 32 divides the hidden size, else one per
    row; an int8 last stage built with either holds the footprint's bytes."""
    torch = pytest.importorskip("torch")
    from worker_runtime import Stage

    config = ModelConfig.from_dict({**CONFIG, "hidden_size": hidden, "num_hidden_layers": 2})
    model = profile_model(config, name="tiny")
    scales = 1000 * hidden // 32 if hidden % 32 == 0 else 1000
    assert model.head.weight_bytes[8] == 1000 * hidden + 2 * scales + 2 * hidden  # + the final norm
    stage = Stage(config, 1, 2, dtype=torch.bfloat16, precision=Precision(8), kv_tokens=16)
    assert stage.memory().weight_bytes == stage_footprint(model, 1, 2, Precision(8), batch=1).weights_bytes
