"""Operator pins with tensor-parallel groups (joint.py, planner.py): a pinned device holds its range alone
or as the first rank of a group, against a brute force; the planner honours pins with groups on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning.cost_model import CostModel
from controlplane.planning.joint import joint_partition
from controlplane.planning.planner import plan
from controlplane.planning.request import Pin
from controlplane.planning.validate import validate
from tests.planning.test_exact_groups import brute_force, request_for

LAYOUTS = [{"n0": ["A100*", "A10*", "3090*"]}, {"n0": ["A10*", "3090*"], "n1": ["T4"]}]


@settings(max_examples=25, deadline=None)
@given(layout=st.sampled_from(LAYOUTS),
       sizes=st.lists(st.integers(300, 9000).map(lambda m: m * 1_000_000), min_size=2, max_size=3),
       micro=st.integers(1, 4), share=st.sampled_from([0.0, 0.5]),
       objective=st.sampled_from(["bottleneck", "chain"]), pinned=st.integers(0, 2), data=st.data())
def test_pinned_joint_search_equals_brute_force(layout, sizes, micro, share, objective, pinned, data):
    request = request_for(layout, sizes, batch=micro, share=share)
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    start = data.draw(st.integers(0, cost.num_layers - 1))
    end = data.draw(st.integers(start + 1, cost.num_layers))
    pins = {devices[pinned].name: (start, end)}
    budget, bits = request.quantized_layer_budget, request.sorted_bits
    found = joint_partition(cost, devices, micro, budget, bits, objective, pins)
    expected = brute_force(cost, devices, micro, budget, bits, objective, pins)
    if found is None:
        assert not np.isfinite(expected[0])
        return
    assert (found.objective_s, found.quantized) == pytest.approx(expected, rel=1e-9)
    assert any((p.device, p.start, p.end) == (devices[pinned].name, start, end) for p in found.stages)
    assert not any(s.device == devices[pinned].name for p in found.stages for s in p.group[1:])


def test_the_planner_keeps_a_pinned_group_stage_and_validates_it():
    request = request_for({"n0": ["A100*", "A10*", "3090*"]}, [3_000_000_000] * 4, objective="latency",
                          tensor_parallel=True, pins=(Pin("n0/gpu1", 0, 4),))
    best = plan(request)
    stage = best.replicas[0].stages[0]
    assert (stage.device, stage.start, stage.end) == ("n0/gpu1", 0, 4) and stage.group
    assert stage.group[0].device == "n0/gpu1"
    assert validate(best, request).ok
