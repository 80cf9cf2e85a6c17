"""The explanation of a tensor-parallel group's low bits speaks of the group's memory (explain.py): the
ranks' usable memory at 16 bits and the rank that would overflow, not one card's."""

from __future__ import annotations

from controlplane.planning.cost_model import CostModel
from controlplane.planning.evaluate import evaluate_replica
from controlplane.planning.explain import explain
from controlplane.planning.tensor_parallel import group_placement
from tests.planning.test_exact_groups import request_for


def reason(sizes: list[int]) -> tuple[str, CostModel]:
    """The low-bit sentence of a plan of one group stage (an A100-80GB and an A10) holding every layer
    at 4 bits."""
    request = request_for({"n0": ["A100*", "A10*"]}, sizes, share=1.0, tensor_parallel=True)
    cost = CostModel(request)
    devices = tuple(request.fleet.devices)
    stage = group_placement(cost, devices, 0, cost.num_layers, 4, 1)
    replica = evaluate_replica(cost, (stage,), 1, 0)
    lines = [line for line in explain(request, cost, [replica]) if "rank(s) of its group run layers" in line]
    assert len(lines) == 1
    return lines[0], cost


def test_a_group_too_small_at_16_bits_names_the_rank_that_overflows_and_the_groups_memory():
    line, cost = reason([15_000_000_000] * 4)  # 120 GB at 16 bits: more than both cards hold
    assert line.startswith("n0/gpu0 and 1 more rank(s) of its group run layers [0, 4) at 4 bits")
    assert "would need" in line and "its card has" in line and "the group" in line
    rank = line.split("rank ")[1].split(" ")[0]
    group = group_placement(cost, tuple(cost.fleet.devices), 0, 4, 16, 1)
    fit = cost.memory(cost.device(group.device), group)
    overflowing = [s.device for s, r in zip(group.group, fit.ranks)
                   if r.holding(cost.kv_required) > r.capacity_bytes]
    assert rank in overflowing
    assert "the card has" not in line  # one card's memory is not the comparison


def test_a_group_that_fits_at_16_bits_is_explained_by_its_step():
    line, _ = reason([2_000_000_000] * 4)  # 16 GB at 16 bits: the group holds it
    assert "their step would take" in line and "a group made to keep pace" in line
