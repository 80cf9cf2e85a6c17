"""The measured quality budget (``max_kl``): exact against brute forces; it spends KL where it is least."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planning import plan as make_plan
from controlplane.planning.cost_model import CostModel
from controlplane.planning.partition import bottleneck_partition, sum_partition_kl
from controlplane.planning.plan import Placement
from controlplane.planning.quality_budget import KL_UNITS, THROUGHPUT_TOLERANCE, kl_prefix_units, plan_kl
from controlplane.planning.request import PlanningError, PlanRequest, Workload
from tests.planning.factories import CARDS, fleet, profile


def stage_choices(cost: CostModel, device, micro_batch: int, start: int, end: int, prefix) -> list:
    """(step time, KL units) of every precision option of [start, end) on ``device`` that fits memory."""
    candidates = [Placement(device.name, start, end, b) for b in (16, 8, 4)]
    candidates += [Placement(device.name, start, end, 16, b, s)
                   for b in (8, 4) for s in range(start + 1, end)]
    found = []
    for p in candidates:
        memory = cost.memory(device, p)
        if memory.holding(cost.kv_required) <= memory.capacity_bytes:
            low = p.low_bits if p.bits == 16 else p.bits
            first = p.split if p.bits == 16 else start
            units = 0.0 if low is None or low == 16 else prefix[low][end] - prefix[low][first]
            found.append((cost.decode_s(device, p, micro_batch), units))
    return found


def brute_force(cost: CostModel, devices, micro_batch: int, prefix):
    """(min bottleneck within the KL budget, least KL units among plans within 1% of it)."""
    layers = cost.num_layers
    choices = functools.cache(lambda d, s, e: stage_choices(cost, devices[d], micro_batch, s, e, prefix))
    plans = []
    for k in range(1, min(len(devices), layers) + 1):
        for order in itertools.permutations(range(len(devices)), k):
            hop = max((cost.hop_s(devices[a], devices[b], micro_batch) for a, b in zip(order, order[1:])),
                      default=0.0)
            for cut in itertools.combinations(range(1, layers), k - 1):
                bounds = (0, *cut, layers)
                per_stage = [choices(d, bounds[i], bounds[i + 1]) for i, d in enumerate(order)]
                for combo in itertools.product(*per_stage):
                    units = sum(c[1] for c in combo)
                    if units <= KL_UNITS:
                        plans.append((max(hop, *(c[0] for c in combo)), units))
    if not plans:
        return None, None
    best = min(t for t, _ in plans)
    return best, min(u for t, u in plans if t * (1.0 - THROUGHPUT_TOLERANCE) <= best)


def measured_request(cards, sizes, batch, sensitivity, max_kl):
    model = replace(profile(sizes=sizes, vocab=32000), sensitivity=sensitivity)
    return PlanRequest(fleet({"n0": cards}, network_gbps=10), model, Workload(batch=batch, context=2048),
                       max_kl=max_kl)


@settings(max_examples=25, deadline=None)
def drawn_instance(cards, sizes, batch, data):
    """A measured request drawn for the brute-force tests: per-layer KL at 8 bits and more at 4 bits,
    a budget from none to everything; with its cost model, devices, KL prefix sums, the KL and budget."""
    kl8 = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(sizes), max_size=len(sizes)))
    extra = data.draw(st.lists(st.floats(0.0, 4.0), min_size=len(sizes), max_size=len(sizes)))
    sensitivity = {8: tuple(kl8), 4: tuple(a + b for a, b in zip(kl8, extra))}
    max_kl = data.draw(st.sampled_from([0.0, 0.5, 1.5, 4.0, 100.0]))
    request = measured_request(cards, sizes, batch, sensitivity, max_kl)
    prefix = kl_prefix_units(sensitivity, max_kl, request.bits)
    return request, CostModel(request), list(request.fleet.devices), prefix, sensitivity, max_kl


@given(cards=st.lists(st.sampled_from(sorted(CARDS)), min_size=1, max_size=3),
       sizes=st.lists(st.integers(200, 1500).map(lambda m: m * 1_000_000), min_size=2, max_size=5),
       batch=st.integers(1, 8), data=st.data())
def test_measured_bottleneck_equals_brute_force(cards, sizes, batch, data):
    request, cost, devices, prefix, sensitivity, max_kl = drawn_instance(cards, sizes, batch, data)
    found = bottleneck_partition(cost, devices, batch, KL_UNITS, request.bits, exact_order=True, kl=prefix)
    best, least = brute_force(cost, devices, batch, prefix)
    if best is None:
        assert found is None
        return
    assert found is not None
    assert found.objective_s * (1.0 - THROUGHPUT_TOLERANCE) <= best * (1 + 1e-12)
    assert found.objective_s >= best * (1 - 1e-12)
    assert found.quantized == least
    assert plan_kl(found.stages, sensitivity) <= max_kl * (1 + 1e-6) + 1e-12  # units: 1e-6 of the budget


def chain_brute_force(cost: CostModel, devices, micro_batch: int, prefix):
    """(least sum of stage times and hops within the KL budget, least KL units among such plans) over
    every subset of the devices in their order, every boundary and one precision (16, 8 or 4) per stage."""
    layers, plans = cost.num_layers, []
    matrices = [{b: cost.decode_matrix(d, b, micro_batch) for b in (16, 8, 4)} for d in devices]
    for k in range(1, min(len(devices), layers) + 1):
        for order in itertools.combinations(range(len(devices)), k):
            hops = sum(cost.hop_s(devices[a], devices[b], micro_batch) for a, b in zip(order, order[1:]))
            for cut in itertools.combinations(range(1, layers), k - 1):
                bounds = (0, *cut, layers)
                for combo in itertools.product((16, 8, 4), repeat=k):
                    spans = list(zip(order, bounds, bounds[1:], combo))
                    units = sum(prefix[b][e] - prefix[b][s] for _, s, e, b in spans if b < 16)
                    seconds = sum(matrices[d][b][s, e] for d, s, e, b in spans) + hops
                    if units <= KL_UNITS and np.isfinite(seconds):
                        plans.append((seconds, units))
    if not plans:
        return None, None
    best = min(t for t, _ in plans)
    return best, min(u for t, u in plans if t <= best * (1 + 1e-12))


@settings(max_examples=40, deadline=None)
@given(cards=st.lists(st.sampled_from(sorted(CARDS)), min_size=2, max_size=4),
       sizes=st.lists(st.integers(200, 1500).map(lambda m: m * 1_000_000), min_size=2, max_size=6),
       batch=st.integers(1, 8), data=st.data())
def test_measured_chain_equals_brute_force(cards, sizes, batch, data):
    """One micro-batch: the least sum of stage times and hops within max_kl over the order (devices
    skipped, any boundary, one precision per stage), with the least KL among such plans."""
    request, cost, devices, prefix, sensitivity, max_kl = drawn_instance(cards, sizes, batch, data)
    found = sum_partition_kl(cost, devices, batch, request.bits, prefix)
    best, least = chain_brute_force(cost, devices, batch, prefix)
    if best is None:
        assert found is None
        return
    assert found is not None
    assert found.objective_s == pytest.approx(best, rel=1e-9)
    stages = found.stages
    seconds = (sum(cost.decode_s(cost.device(s.device), s, batch) for s in stages)
               + sum(cost.hop_s(cost.device(a.device), cost.device(b.device), batch)
                     for a, b in zip(stages, stages[1:])))
    assert seconds == pytest.approx(best, rel=1e-9)
    assert found.quantized == least
    assert plan_kl(stages, sensitivity) <= max_kl * (1 + 1e-6) + 1e-12
    assert [s.start for s in stages] == [0] + [s.end for s in stages[:-1]]
    assert stages[-1].end == cost.num_layers


# Eight alike layers on cards that need about half of them low: which half is up to the sensitivities.
SIZES = [800_000_000] * 8


def low_layers(result) -> set[int]:
    low = set()
    for replica in result.replicas:
        for s in replica.stages:
            first = s.start if s.bits < 16 else (s.low_from if s.low_bits else s.end)
            low |= set(range(first, s.end))
    return low


def test_low_precision_goes_where_the_measured_kl_is_least():
    """A 3090 and a T4: the count form quantizes the T4's half, the model's second (layers 4-7). When
    those are the sensitive ones, the measured form turns the pipeline round: the T4 takes the first
    half at low precision, and the plan's KL stays within max_kl."""
    cards = ["T4", "3090"]
    counted = make_plan(PlanRequest(fleet({"n0": cards}), profile(sizes=SIZES, vocab=32000),
                                    Workload(batch=4, context=1024), replicas=1))
    assert low_layers(counted) == {4, 5, 6, 7}
    kl = (0.01, 0.01, 0.01, 0.01, 5.0, 5.0, 5.0, 5.0)
    sensitivity = {8: kl, 4: tuple(2 * k for k in kl)}
    measured = make_plan(replace(measured_request(cards, SIZES, 4, sensitivity, max_kl=1.0), replicas=1))
    low = low_layers(measured)
    assert low and low <= {0, 1, 2, 3}, low
    assert plan_kl(measured.replicas[0].stages, sensitivity) <= 1.0
    # Equal predicted throughput: the same bottleneck as the count plan, within the tolerance.
    assert (measured.replicas[0].predicted.decode_tokens_per_s
            >= counted.replicas[0].predicted.decode_tokens_per_s * (1 - THROUGHPUT_TOLERANCE))
    # A budget smaller than any layer's KL: the plan runs everything at 16 bits (it fits, slower).
    tight = make_plan(replace(measured_request(cards, SIZES, 4, sensitivity, max_kl=0.001), replicas=1))
    assert low_layers(tight) == set()


def test_max_kl_needs_a_measured_profile():
    with pytest.raises(PlanningError, match="profile_quality"):
        PlanRequest(fleet({"n0": ["T4"]}), profile(sizes=SIZES, vocab=32000), max_kl=1.0)


def test_without_max_kl_a_measured_profile_breaks_ties_by_the_least_kl():
    """The count budget still rules (same low-bit count, throughput within the tolerance), but among the
    plans the planner compares with equal counts it takes the least measured KL: here the profiled
    model's plan spends 9.52 where the same model without a profile spends 9.84."""
    kl8 = (0.501, 0.129, 0.848, 0.707, 0.394, 0.602, 0.952, 0.242, 0.998, 0.38)
    sensitivity = {8: kl8, 4: tuple(round(k * 3, 3) for k in kl8)}
    layout = {"n0": ["3090", "P40"], "n1": ["T4", "T4"]}
    bare = profile(sizes=[1_200_000_000] * 10, vocab=32000)
    counted = make_plan(PlanRequest(fleet(layout), bare, Workload(batch=4, context=2048)))
    profiled = make_plan(PlanRequest(fleet(layout), replace(bare, sensitivity=sensitivity),
                                     Workload(batch=4, context=2048)))
    assert profiled.quantized_layers == counted.quantized_layers
    assert (profiled.predicted.decode_tokens_per_s
            >= counted.predicted.decode_tokens_per_s * (1 - THROUGHPUT_TOLERANCE))
    spent = [max(plan_kl(r.stages, sensitivity) for r in p.replicas) for p in (counted, profiled)]
    assert spent[1] < spent[0] - 0.1, spent
