"""Ranks of one group at different precisions (mixed_ranks.py) and the int4 rule on a rank's shares
(tensor_parallel.int4_fits)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from controlplane.planning.cost_model import CostModel
from controlplane.planning.joint import joint_partition
from controlplane.planning.mixed_ranks import assignments
from controlplane.planning.planner import plan
from controlplane.planning.quality_budget import quantized_layers
from controlplane.planning.tensor_parallel import group_matrix, group_placement, layout
from tests.planning.test_exact_groups import LAYOUT, SLOW_LOW_BITS, request_for

BIG = [12_000_000_000] * 4  # 96 GB at 16 bits: about all an A100-80GB and an RTX 3090 hold together


def test_assignments_per_rank_up_to_four_ranks_then_one_precision():
    two = assignments(("a", "b"), 8, (16, 8, 4))
    assert set(two) == {(16, 8), (8, 16), (8, 8)} and two[0] == (16, 8)
    assert len(assignments(tuple("abcd"), 4, (16, 8, 4))) == 3 ** 4 - 2 ** 4
    assert assignments(tuple("abcde"), 4, (16, 8, 4)) == [(4,) * 5]


def test_a_card_with_slow_low_bit_kernels_keeps_16_bits_while_its_partner_goes_to_4():
    request = request_for({"n0": ["A100*", "3090*"]}, BIG, share=1.0, health=SLOW_LOW_BITS,
                          objective="latency", tensor_parallel=True)
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    found = joint_partition(cost, devices, 1, request.quantized_layer_budget, request.sorted_bits, "chain")
    stage = next(s for s in found.stages if s.group)
    assert [s.bits for s in stage.group] == [4, 16]
    assert stage.bits == 4 and stage.bits_label == "16/4-bit by rank"
    assert stage.quantized_layers == stage.end - stage.start  # a layer counts low if any rank holds it low
    fit = cost.memory(devices[0], stage)
    assert all(r.holding(cost.kv_required) <= r.capacity_bytes for r in fit.ranks)
    # Faster than both ranks at 4 bits (the 3090's slow kernels) and than both at 16 bits.
    uniform = group_placement(cost, tuple(devices), stage.start, stage.end, 4, 1)
    step = cost.decode_s(devices[0], stage, 1)
    assert step < cost.decode_s(devices[0], uniform, 1)
    assert step < group_matrix(cost, tuple(devices), 16, 1)[stage.start, stage.end]
    best = plan(request)
    group = next(s for r in best.replicas for s in r.stages if s.group)
    assert {s.bits for s in group.group} == {4, 16}
    assert quantized_layers([s.placement for s in best.replicas[0].stages]) == best.quantized_layers


def test_a_4_bit_rank_takes_whole_int4_groups_of_the_output_projection():
    # 12 query heads over 4 kv heads of 96: 288 query columns per kv head, not whole 128-column blocks.
    odd = {**LAYOUT, "num_heads": 12, "num_kv_heads": 4, "head_dim": 96}
    request = request_for({"n0": ["A100*", "A10*"]}, [3_000_000_000] * 4, share=1.0, tensor_parallel=True)
    request = replace(request, model=replace(request.model, extra=odd))
    cost = CostModel(request)
    devices = tuple(request.fleet.devices)
    assert layout(request.model).query_width == 288
    assert not np.isfinite(group_matrix(cost, devices, 4, 1)).any()
    assert np.isfinite(group_matrix(cost, devices, 8, 1)).any()
    best = plan(replace(request, objective="latency"))
    assert all(4 not in (share.bits, s.low_bits) for s in best.replicas[0].stages for share in s.group)
