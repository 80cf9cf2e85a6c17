"""Calibration in the cost model: a device's measured/predicted ratio, per precision, scales its prices,
the searches stay exact with it, and a device measured slow gets less of the model."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.hardware import FleetSpec, NodeSpec
from controlplane.planning import PlanRequest, Workload, plan
from controlplane.planning.cost_model import CostModel, slowdown
from controlplane.planning.plan import Placement
from tests.planning.factories import CARDS, device, fleet, profile
from tests.planning.test_exact import assert_search_equals_brute_force


def calibrated(spec: FleetSpec, factors: dict[str, dict]) -> FleetSpec:
    """``spec`` with some devices' ``calibration`` / ``calibration_by_bits`` replaced."""
    nodes = tuple(NodeSpec(name=n.name, network_gbps=n.network_gbps, devices=tuple(
        dataclasses.replace(d, **factors.get(d.name, {})) for d in n.devices)) for n in spec.nodes)
    return FleetSpec(name=spec.name, nodes=nodes, links=spec.links)


def test_a_precision_takes_its_own_factor_else_the_device_one():
    card = device("n", 0, "T4", calibration=3.0, calibration_by_bits=((4, 5.0), (16, 2.0)))
    assert (card.calibration_at(16), card.calibration_at(8), card.calibration_at(4)) == (2.0, 3.0, 5.0)
    assert slowdown(dataclasses.replace(card, throttle_factor=0.5), 4) == pytest.approx(10.0)
    assert device("n", 0, "T4").calibration_at(4) == 1.0


def test_every_time_of_a_stage_scales_by_its_last_precision_factor():
    """decode and prefill of one stage, and the matrices the searches read, agree: a stage mixing 16
    and 4 bits takes the 4-bit factor, like a stage all at 4 bits."""
    base = fleet({"n": ["T4"]})
    factors = {"n/gpu0": {"calibration": 3.0, "calibration_by_bits": ((16, 2.0), (4, 5.0))}}
    raw = CostModel(PlanRequest(base, profile(8), Workload(batch=4, context=512)))
    cost = CostModel(PlanRequest(calibrated(base, factors), profile(8), Workload(batch=4, context=512)))
    plain, card = raw.device("n/gpu0"), cost.device("n/gpu0")
    for stage, factor in [(Placement(card.name, 0, 4, 16), 2.0), (Placement(card.name, 0, 4, 8), 3.0),
                          (Placement(card.name, 0, 4, 4), 5.0), (Placement(card.name, 0, 4, 16, 4, 2), 5.0),
                          (Placement(card.name, 0, 4, 16, 8, 3), 3.0)]:
        assert cost.decode_s(card, stage, 2) == pytest.approx(raw.decode_s(plain, stage, 2) * factor)
        assert cost.prefill_s(card, stage, 64) == pytest.approx(raw.prefill_s(plain, stage, 64) * factor)
    for bits, factor in [(16, 2.0), (8, 3.0), (4, 5.0)]:
        assert cost.decode_matrix(card, bits, 2)[0, 4] == pytest.approx(
            raw.decode_matrix(plain, bits, 2)[0, 4] * factor)
    # The split search's stages: none low is 16-bit, any low takes the low factor.
    times = cost.split_times(card, 4, 2, np.array([0, 0, 0]), np.array([4, 4, 4]), np.array([0, 1, 4]))
    expected = [raw.decode_s(plain, Placement(card.name, 0, 4, 16), 2) * 2.0,
                raw.decode_s(plain, Placement(card.name, 0, 4, 16, 4, 3), 2) * 5.0,
                raw.decode_s(plain, Placement(card.name, 0, 4, 4), 2) * 5.0]
    assert times == pytest.approx(expected)


def test_an_uncalibrated_fleet_prices_as_before():
    base = fleet({"n": ["A100", "T4"]})
    request = PlanRequest(base, profile(16), Workload(batch=8, context=1024))
    ones = calibrated(base, {d.name: {"calibration_by_bits": ((16, 1.0), (8, 1.0), (4, 1.0))}
                             for d in base.devices})
    assert plan(request) == dataclasses.replace(plan(dataclasses.replace(request, fleet=ones)))


def test_a_device_measured_slow_gets_fewer_layers():
    """Two alike cards split a model neither holds alone evenly; once one is measured at twice its
    predicted time at 16 bits, the planner's next plan gives it fewer layers."""
    base = fleet({"n": ["3090", "3090"]})
    request = PlanRequest(base, profile(16, layer_params=800_000_000), Workload(batch=8, context=1024),
                          bits=(16,), replicas=1)

    def layers(result) -> dict[str, int]:
        return {s.device: s.end - s.start for s in result.replicas[0].stages}

    before = plan(request)
    assert sorted(layers(before).values()) == [8, 8]
    slow = calibrated(base, {"n/gpu1": {"calibration_by_bits": ((16, 2.0),)}})
    after = plan(dataclasses.replace(request, fleet=slow))
    assert layers(after)["n/gpu1"] < layers(after)["n/gpu0"]
    assert after.predicted.decode_tokens_per_s < before.predicted.decode_tokens_per_s
    # A factor at another precision than the stages run at changes nothing.
    elsewhere = calibrated(base, {"n/gpu1": {"calibration_by_bits": ((4, 2.0),)}})
    assert layers(plan(dataclasses.replace(request, fleet=elsewhere))) == layers(before)


factor = st.sampled_from([0.5, 1.0, 1.7, 3.0])


@settings(max_examples=25, deadline=None)
@given(cards=st.lists(st.sampled_from(sorted(CARDS)), min_size=1, max_size=4),
       layer_sizes=st.lists(st.integers(100, 1500).map(lambda m: m * 1_000_000), min_size=2, max_size=8),
       batch=st.integers(1, 16), share=st.sampled_from([0.25, 0.5, 1.0]),
       factors=st.lists(st.tuples(factor, factor, factor, factor), min_size=4, max_size=4))
def test_the_bottleneck_search_stays_exact_with_factors_per_precision(cards, layer_sizes, batch, share,
                                                                       factors):
    """The search (matrices, split prices) against the brute force pricing each stage on its own."""
    base = fleet({"n0": cards}, network_gbps=10)
    spec = calibrated(base, {d.name: {"calibration": f[0], "calibration_by_bits": ((16, f[1]), (8, f[2]),
                                                                                   (4, f[3]))}
                             for d, f in zip(base.devices, factors)})
    request = PlanRequest(spec, profile(sizes=layer_sizes), Workload(batch=batch, context=2048),
                          max_quantized=share)
    assert_search_equals_brute_force(request, CostModel(request), list(spec.devices), batch)
