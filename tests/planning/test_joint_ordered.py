"""The joint search beyond ``EXACT_DEVICES`` (units in topology order, each used or skipped, joint.py)
against a brute force over that space: its bounds drop only plans that cannot win."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning.cost_model import CostModel
from controlplane.planning.joint import (
    EXACT_DEVICES,
    _pinned_first,
    _sequence,
    candidate_groups,
    joint_partition,
)
from tests.planning.test_exact_groups import precisions_of, request_for, stage_price


def brute_force_ordered(cost, devices, micro_batch, budget, bits, objective, pins=None):
    """(least value, fewest low-bit layers at it) over every subsequence of each k's unit sequence (with
    every pinned unit, on its range), every boundary and precision; the bottleneck is the slowest stage
    or hop, the chain the sum of stage times and hops."""
    pins = pins or {}
    groups = _pinned_first(candidate_groups(cost, devices), pins)
    layers, best = cost.num_layers, (np.inf, 0)
    for k in sorted({len(g) for g in groups}):
        sequence = _sequence(devices, [g for g in groups if len(g) == k])
        for count in range(1, min(len(sequence), layers) + 1):
            for used in itertools.combinations(sequence, count):
                if not set(pins) <= {u[0].name for u in used}:
                    continue
                hops = [cost.hop_s(a[0], b[0], micro_batch) for a, b in zip(used, used[1:])]
                for cuts in itertools.combinations(range(1, layers), count - 1):
                    bounds = (0, *cuts, layers)
                    spans = list(zip(bounds, bounds[1:]))
                    if any(pins.get(u[0].name, span) != span for u, span in zip(used, spans)):
                        continue
                    options = [precisions_of(bounds[i], bounds[i + 1], bits, used[i]) for i in range(count)]
                    for precisions in itertools.product(*options):
                        low = sum(p[3] for p in precisions)
                        if low > budget:
                            continue
                        times = [stage_price(cost, u, bounds[i], bounds[i + 1], b, micro_batch, lb, lf)[0]
                                 for i, (u, (b, lb, lf, _)) in enumerate(zip(used, precisions))]
                        value = max(times + hops) if objective == "bottleneck" else sum(times) + sum(hops)
                        if np.isfinite(value) and (value, low) < best:
                            best = (value, low)
    return best


LAYOUTS = [{"n0": ["A100*", "A10*", "3090*"], "n1": ["T4", "P40"]},
           {"n0": ["A10", "3090", "T4"], "n1": ["V100*", "A100*"]},
           {"n0": ["V100*", "T4*", "A10*", "3090*", "P40*"]}]


@settings(max_examples=20, deadline=None)
@given(layout=st.sampled_from(LAYOUTS),
       sizes=st.lists(st.integers(300, 9000).map(lambda m: m * 1_000_000), min_size=2, max_size=3),
       micro=st.integers(1, 8), share=st.sampled_from([0.0, 0.5, 1.0]),
       objective=st.sampled_from(["bottleneck", "chain"]), pinned=st.sampled_from([None, 0, 1, 4]),
       data=st.data())
def test_ordered_search_equals_brute_force(layout, sizes, micro, share, objective, pinned, data):
    request = request_for(layout, sizes, batch=micro, share=share)
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    assert len(devices) > EXACT_DEVICES
    pins = {}
    if pinned is not None:
        start = data.draw(st.integers(0, cost.num_layers - 1))
        pins[devices[pinned].name] = (start, data.draw(st.integers(start + 1, cost.num_layers)))
    budget, bits = request.quantized_layer_budget, request.sorted_bits
    found = joint_partition(cost, devices, micro, budget, bits, objective, pins)
    expected = brute_force_ordered(cost, devices, micro, budget, bits, objective, pins)
    if found is None:
        assert not np.isfinite(expected[0])
        return
    assert (found.objective_s, found.quantized) == pytest.approx(expected, rel=1e-9)
    assert found.stages[0].start == 0 and found.stages[-1].end == cost.num_layers
    held = {(p.device, p.start, p.end) for p in found.stages}
    assert all((name, *span) in held for name, span in pins.items())
