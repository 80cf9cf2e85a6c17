"""One stage footprint (contracts.footprint) for the planner, the agent and the worker: the formula by
hand, then the three sides computing the same bytes for the same stage."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agents.memory_budget import rank_footprints, spec_footprint
from contracts.footprint import (
    RESERVED_BYTES,
    RESERVED_FRACTION,
    UNBOUNDED_KV_TOKENS,
    rank_footprint,
    stage_footprint,
    tensor_layout,
    usable_bytes,
)
from contracts.hardware import GIB
from contracts.model_config import ModelConfig
from contracts.precision import Precision
from contracts.profiler import profile_model
from contracts.stage_spec import StageSpec, TensorRank
from controlplane.planning import PlanRequest, Workload
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement, Share
from controlplane.planning.tensor_parallel import _rank, layout
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


# A model whose 4 kv heads split unevenly: 3 heads and 448 MLP columns on one rank, 1 and 192 on the other.
GROUP_CONFIG = {**CONFIG, "num_attention_heads": 8, "num_key_value_heads": 4}
SHARES = ((3, 448), (1, 192))


def _group_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GROUP_CONFIG))
    return profile_model(ModelConfig.from_file(tmp_path), name=str(tmp_path))


def test_a_ranks_footprint_is_its_share_of_the_stage(tmp_path):
    model = _group_model(tmp_path)
    # Attention: q and o (256 x 8 heads x 32) and k and v (256 x 4 x 32); the MLP: 3 x 256 x 640.
    assert tensor_layout(model).attention == pytest.approx(2 / 7)
    precision = Precision(16, 4, 6)
    whole = stage_footprint(model, 0, 12, precision, kv_tokens=50, batch=2)
    ranks = [rank_footprint(model, 0, 12, precision, kv_heads=h, intermediate=c, first=r == 0, kv_tokens=50,
                            batch=2) for r, (h, c) in enumerate(SHARES)]
    assert [r.kv_bytes_per_token for r in ranks] == [3 * whole.kv_bytes_per_token // 4,
                                                     whole.kv_bytes_per_token // 4]
    assert all(r.workspace_bytes == whole.workspace_bytes and r.kv_tokens == 50 for r in ranks)
    assert abs(sum(r.weights_bytes for r in ranks) - whole.weights_bytes) <= len(ranks)  # rounding only
    layers = 6 * model.layers[0].weight_bytes[16] + 6 * model.layers[0].weight_bytes[4]
    part = 2 / 7 * 1 / 4 + 5 / 7 * 192 / 640
    head = model.head.weight_bytes[4] * 192 / 640
    assert ranks[1].weights_bytes == pytest.approx(layers * part + head, abs=1)
    # The embedding is whole on the first rank of a first stage, and nowhere else.
    middle, first = ([rank_footprint(model, start, 6, kv_heads=3, intermediate=448, first=first, batch=2)
                      for first in (True, False)] for start in (2, 0))
    assert middle[0] == middle[1]
    assert first[0].weights_bytes - first[1].weights_bytes == model.embedding.weight_bytes[16]
    with pytest.raises(ValueError, match="does not say its heads"):
        rank_footprint(profile(4), 0, 2, kv_heads=1, intermediate=64, first=True, batch=1)


def test_the_planners_group_prices_hold_every_rank_to_its_footprint(tmp_path):
    """The joint search prices every rank of every [i, j) from prefix sums (``tensor_parallel._rank``):
    the same bytes as the rank's footprint, for every range, precision and split."""
    model = _group_model(tmp_path)
    cost = CostModel(PlanRequest(fleet({"n": ["A100", "T4"]}), model, Workload(batch=3, context=256)))
    n, lay = model.num_layers, layout(model)
    for bits, low_bits in ((16, None), (8, None), (4, None), (16, 8), (16, 4)):
        for start in range(n):
            for end in range(start + 1, n + 1):
                for split in [end] if low_bits is None else range(start + 1, end):
                    precision = Precision(bits) if split == end else Precision(bits, low_bits, split)
                    for r, (heads, columns) in enumerate(SHARES):
                        share = Share(f"n/gpu{r}", heads, columns, bits)
                        _, kept = _rank(cost, lay, share, r == 0, np.array(start), np.array(end), 1.0, None,
                                        np.array(split), low_bits)
                        want = rank_footprint(model, start, end, precision, kv_heads=heads,
                                              intermediate=columns, first=r == 0, batch=3)
                        assert float(kept) == want.holding(cost.kv_required), (start, end, split, bits, r)


def test_the_planner_and_the_agent_compute_the_same_footprint_of_each_rank(tmp_path):
    model = _group_model(tmp_path)
    request = PlanRequest(fleet({"n": ["A100", "T4"]}), model, Workload(batch=5, context=256))
    cost = CostModel(request)
    ranks = tuple(TensorRank("cpu", h, c, 16, r) for r, (h, c) in enumerate(SHARES))
    for start, end, bits, low_bits, low_from in STAGES:
        shares = tuple(Share(f"n/gpu{r}", h, c, bits) for r, (h, c) in enumerate(SHARES))
        placement = Placement("n/gpu0", start, end, bits, low_bits, low_from, group=shares)
        planner = cost.memory(request.fleet.device("n/gpu0"), placement)
        spec = StageSpec(pipeline_id="d1-r0", auth_token="t", model_path=str(tmp_path),
                         stage_index=0 if start == 0 else 1, num_stages=3, layers=(start, end),
                         listen="tcp://127.0.0.1:1", head="tcp://127.0.0.1:1", next="tcp://127.0.0.1:2",
                         **Precision(bits, low_bits, low_from).fields(), kv_tokens=planner.kv_tokens, batch=5,
                         tensor_group=tuple(replace(rank, bits=bits) for rank in ranks))
        agent = rank_footprints(spec)
        assert [a.total_bytes for a in agent] == [r.holding(planner.kv_tokens) for r in planner.ranks]
        assert all(r.holding(planner.kv_tokens) <= r.capacity_bytes for r in planner.ranks)
        assert [r.capacity_bytes for r in planner.ranks] == [usable_bytes(d) for d in request.fleet.devices]
