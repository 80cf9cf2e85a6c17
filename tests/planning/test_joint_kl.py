"""The joint search under the measured quality budget (joint_kl.py) against a brute force over every
sequence of units, boundary and precision (per rank on groups) within ``max_kl``; the planner searches
groups under ``max_kl``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning.cost_model import CostModel
from controlplane.planning.joint import joint_partition
from controlplane.planning.planner import plan
from controlplane.planning.quality_budget import KL_UNITS, kl_prefix_units, plan_kl
from controlplane.planning.request import PlanRequest, Workload
from controlplane.planning.validate import validate
from tests.planning.factories import fleet
from tests.planning.test_exact_groups import SLOW_LOW_BITS, brute_force, model

LAYOUTS = [{"n0": ["A100*", "A10*"]}, {"n0": ["A100*", "A10*", "3090*"]},
           {"n0": ["A10*", "3090*"], "n1": ["T4"]}]


def measured(layout, sizes, batch, kl8, extra, max_kl, slow_low=False, **kwargs) -> PlanRequest:
    sensitivity = {8: tuple(kl8), 4: tuple(a + b for a, b in zip(kl8, extra))}
    return PlanRequest(fleet(layout, network_gbps=10, health=SLOW_LOW_BITS if slow_low else None),
                       replace(model(sizes), sensitivity=sensitivity), Workload(batch=batch, context=2048),
                       max_kl=max_kl, **kwargs)


@settings(max_examples=30, deadline=None)
@given(layout=st.sampled_from(LAYOUTS),
       sizes=st.lists(st.integers(300, 9000).map(lambda m: m * 1_000_000), min_size=2, max_size=3),
       micro=st.integers(1, 4), objective=st.sampled_from(["bottleneck", "chain"]), slow_low=st.booleans(),
       data=st.data())
def test_measured_joint_search_equals_brute_force(layout, sizes, micro, objective, slow_low, data):
    layers = len(sizes)
    kl8 = data.draw(st.lists(st.floats(0.001, 0.05), min_size=layers, max_size=layers))
    extra = data.draw(st.lists(st.floats(0.0, 0.2), min_size=layers, max_size=layers))
    max_kl = data.draw(st.floats(0.0, 0.3))
    request = measured(layout, sizes, micro, kl8, extra, max_kl, slow_low)
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    kl = kl_prefix_units(request.model.sensitivity, max_kl, request.bits)
    found = joint_partition(cost, devices, micro, KL_UNITS, request.sorted_bits, objective, kl=kl)
    expected = brute_force(cost, devices, micro, KL_UNITS, request.sorted_bits, objective, kl=kl)
    if found is None:
        assert not np.isfinite(expected[0])
        return
    assert (found.objective_s, found.quantized) == pytest.approx(expected, rel=1e-9)
    assert plan_kl(found.stages, request.model.sensitivity) <= max_kl * (1 + 1e-6) + 1e-12


def test_the_planner_searches_groups_under_max_kl_and_stays_within_it():
    request = measured({"n0": ["A100*", "A10*", "3090*"]}, [3_000_000_000] * 4, 1, [0.01] * 4, [0.02] * 4,
                       0.05, objective="latency", tensor_parallel=True)
    best = plan(request)
    assert any(s.group for s in best.replicas[0].stages)
    assert plan_kl([s.placement for s in best.replicas[0].stages], request.model.sensitivity) <= 0.05 + 1e-9
    assert validate(best, request).ok
    alone = plan(replace(request, tensor_parallel=False))
    assert best.predicted.token_latency_ms < alone.predicted.token_latency_ms
