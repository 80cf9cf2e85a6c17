"""The partition searches against a brute force over every order, subset, boundary and precision."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from controlplane.planning.cost_model import CostModel
from controlplane.planning.evaluate import round_seconds
from controlplane.planning.partition import bottleneck_partition, sum_partition
from controlplane.planning.plan import Placement
from controlplane.planning.quality_budget import THROUGHPUT_TOLERANCE, quantized_layers
from controlplane.planning.request import PlanRequest, Workload
from tests.planning.factories import CARDS, fleet, profile


def stage_options(cost: CostModel, device, micro_batch: int, bits=(16, 8, 4)) -> np.ndarray:
    """O[i, j, q] = the fastest decode step of [i, j) on ``device`` with its last q layers below 16
    bits (q = 0: all at 16 bits), over the allowed precisions; inf where nothing fits or q > j - i.

    Priced one stage at a time through the cost model's scalar figures (``decode_s``, ``memory``),
    not the matrices and cubes the search uses.
    """
    n = cost.num_layers + 1
    options = np.full((n, n, n), np.inf)
    for start, end in itertools.combinations(range(n), 2):
        candidates = [Placement(device.name, start, end, b) for b in bits]
        if 16 in bits:
            candidates += [Placement(device.name, start, end, 16, b, split)
                           for b in bits if b < 16 for split in range(start + 1, end)]
        for p in candidates:
            memory = cost.memory(device, p)
            if memory.holding(cost.kv_required) <= memory.capacity_bytes:
                q = p.quantized_layers
                options[start, end, q] = min(options[start, end, q], cost.decode_s(device, p, micro_batch))
    return options


def feasible_plans(cost: CostModel, devices, micro_batch: int, budget: int, bits=(16, 8, 4)):
    """(bottleneck, low-bit layers, network hops) of the fastest plan of every order of every subset
    of the devices, every boundary and every count of low-bit layers within the budget, by
    enumeration. A stage may hold its last layers at a lower precision than the rest.

    Per order and boundaries, the fastest plan with each count of low-bit layers comes from
    combining the stages' options one stage at a time (the max of a stage's time and the best of
    the stages before it, for every split of the count): every combination is covered.
    """
    layers = cost.num_layers
    options = [stage_options(cost, d, micro_batch, bits) for d in devices]
    plans = []  # per order: (bottlenecks, low-bit layers, hops)
    for k in range(1, min(len(devices), layers) + 1):
        cuts = np.array([(0, *c, layers) for c in itertools.combinations(range(1, layers), k - 1)])
        for order in itertools.permutations(range(len(devices)), k):
            pairs = [(devices[a], devices[b]) for a, b in zip(order, order[1:])]
            slowest_hop = max((cost.hop_s(a, b, micro_batch) for a, b in pairs), default=0.0)
            crossings = sum(a.node != b.node for a, b in pairs)
            best = np.full((len(cuts), budget + 1), np.inf)  # [boundaries, low-bit layers so far]
            best[:, 0] = slowest_hop
            for i, d in enumerate(order):
                stage = options[d][cuts[:, i], cuts[:, i + 1], : budget + 1]  # (C, q)
                combined = np.full_like(best, np.inf)
                for q in range(budget + 1):
                    combined[:, q:] = np.minimum(combined[:, q:],
                                                 np.maximum(best[:, : budget + 1 - q], stage[:, q, None]))
                best = combined
            ok = np.isfinite(best)
            plans.append((best[ok], np.nonzero(ok)[1], np.full(int(ok.sum()), crossings)))
    return tuple(np.concatenate(column) for column in zip(*plans))


def chain_plans(cost: CostModel, devices, micro_batch: int, budget: int, bits=(16, 8, 4)):
    """(sum of stage times and hops, low-bit layers) of every plan over every subset of the devices
    in their given order with one precision per stage (``sum_partition``'s plans), by enumeration.

    Low precisions all count the same towards the budget, so per stage only the best 16-bit time and
    the best low-bit time matter: 2^k precision choices per composition instead of 3^k.
    """
    layers = cost.num_layers
    matrices = [{b: cost.decode_matrix(d, b, micro_batch) for b in bits} for d in devices]
    plans = []
    for k in range(1, min(len(devices), layers) + 1):
        cuts = np.array([(0, *c, layers) for c in itertools.combinations(range(1, layers), k - 1)])
        sizes = np.diff(cuts, axis=1)
        for order in itertools.combinations(range(len(devices)), k):
            hops = sum(cost.hop_s(devices[a], devices[b], micro_batch) for a, b in zip(order, order[1:]))
            full = np.stack([matrices[d][16][cuts[:, i], cuts[:, i + 1]] for i, d in enumerate(order)],
                            axis=1)
            low = np.stack([np.minimum(matrices[d][8], matrices[d][4])[cuts[:, i], cuts[:, i + 1]]
                            for i, d in enumerate(order)], axis=1)
            masks = np.array(list(itertools.product((False, True), repeat=k)))  # (2^k, k)
            times = np.where(masks[None], low[:, None], full[:, None]).sum(axis=2) + hops  # (C, 2^k)
            quantized = (sizes[:, None, :] * masks[None]).sum(axis=2)
            ok = np.isfinite(times) & (quantized <= budget)
            plans.append((times[ok], quantized[ok]))
    return tuple(np.concatenate(column) for column in zip(*plans))


def brute_force(cost: CostModel, devices, micro_batch: int, budget: int, bits=(16, 8, 4)):
    """(min bottleneck, fewest low-bit layers among plans within 1% of it), by enumeration."""
    times, quantized, _ = feasible_plans(cost, devices, micro_batch, budget, bits)
    if not len(times):
        return None, None
    best = float(times.min())
    return best, int(quantized[times * (1.0 - THROUGHPUT_TOLERANCE) <= best].min())


def instance(cards, layer_sizes, batch, two_nodes, budget_share):
    layout = {"n0": cards[: (len(cards) + 1) // 2], "n1": cards[(len(cards) + 1) // 2:]} if two_nodes \
        else {"n0": cards}
    layout = {k: v for k, v in layout.items() if v}
    request = PlanRequest(fleet(layout, network_gbps=10), profile(sizes=layer_sizes, vocab=32000),
                          Workload(batch=batch, context=2048), max_quantized=budget_share)
    return request, CostModel(request)


cards = st.lists(st.sampled_from(sorted(CARDS)), min_size=1, max_size=5)
sizes = st.lists(st.integers(100, 1500).map(lambda m: m * 1_000_000), min_size=2, max_size=10)


@settings(max_examples=30, deadline=None)
@given(cards=cards, layer_sizes=sizes, batch=st.integers(1, 16), micro=st.integers(1, 4),
       two_nodes=st.booleans(), share=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_bottleneck_equals_brute_force(cards, layer_sizes, batch, micro, two_nodes, share):
    request, cost = instance(cards, layer_sizes, batch, two_nodes, share)
    devices = list(request.fleet.devices)
    micro_batch = max(1, batch // micro)
    assert_search_equals_brute_force(request, cost, devices, micro_batch)


def assert_search_equals_brute_force(request, cost, devices, micro_batch) -> None:
    """The exact-order bottleneck search finds a plan within 1% of the brute-force optimum, with the
    fewest low-bit layers such plans can have (or none when the brute force finds none)."""
    found = bottleneck_partition(cost, devices, micro_batch, request.quantized_layer_budget, request.bits,
                                 exact_order=True)
    best, fewest = brute_force(cost, devices, micro_batch, request.quantized_layer_budget)
    if best is None:
        assert found is None
        return
    assert found is not None
    assert found.objective_s * (1.0 - THROUGHPUT_TOLERANCE) <= best * (1 + 1e-12)
    assert found.quantized == fewest
    assert found.objective_s >= best * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(cards=st.lists(st.sampled_from(sorted(CARDS)), min_size=3, max_size=5), layer_sizes=sizes,
       batch=st.integers(1, 16), share=st.sampled_from([0.0, 0.5, 1.0]))
@example(cards=["T4", "3090", "3090", "V100"], layer_sizes=[200_000_000] * 8, batch=8, share=0.5)
def test_fewest_network_hops_among_plans_within_tolerance(cards, layer_sizes, batch, share):
    """Among plans within 1% of the best bottleneck and with the fewest low-bit layers, the search
    crosses the network as few times as any (a node is left and re-entered only when that pays)."""
    request, cost = instance(cards, layer_sizes, batch, True, share)
    devices = list(request.fleet.devices)
    budget = request.quantized_layer_budget
    found = bottleneck_partition(cost, devices, batch, budget, request.bits, exact_order=True)
    times, quantized, hops = feasible_plans(cost, devices, batch, budget)
    if found is None:
        assert not len(times)
        return
    within = times * (1.0 - THROUGHPUT_TOLERANCE) <= times.min()
    fewest = quantized[within].min()
    nodes = [cost.device(s.device).node for s in found.stages]
    assert found.quantized == fewest
    assert sum(a != b for a, b in zip(nodes, nodes[1:])) == hops[within & (quantized == fewest)].min()


def test_six_devices_ten_layers_three_precisions():
    request, cost = instance(["A100", "T4", "P40", "3090", "A10", "V100"],
                             [400_000_000 + 37_000_000 * i for i in range(10)], 8, True, 0.5)
    devices = list(request.fleet.devices)
    found = bottleneck_partition(cost, devices, 2, request.quantized_layer_budget, request.bits,
                                 exact_order=True)
    best, fewest = brute_force(cost, devices, 2, request.quantized_layer_budget)
    assert found.objective_s * (1.0 - THROUGHPUT_TOLERANCE) <= best * (1 + 1e-12)
    assert found.quantized == fewest


def test_exact_search_finds_the_optimum_without_tolerance(monkeypatch):
    """With the 1% trade switched off, the search returns the brute force's bottleneck exactly."""
    monkeypatch.setattr("controlplane.planning.bottleneck.THROUGHPUT_TOLERANCE", 0.0)
    for seed in range(4):
        rng = np.random.default_rng(seed)
        cards_ = list(rng.choice(sorted(CARDS), size=4))
        layer_sizes = [int(x) * 1_000_000 for x in rng.integers(100, 1500, size=8)]
        request, cost = instance(cards_, layer_sizes, 8, bool(seed % 2), 0.5)
        devices = list(request.fleet.devices)
        found = bottleneck_partition(cost, devices, 4, request.quantized_layer_budget, request.bits,
                                     exact_order=True)
        monkeypatch.setattr("tests.planning.test_exact.THROUGHPUT_TOLERANCE", 0.0)
        best, _ = brute_force(cost, devices, 4, request.quantized_layer_budget)
        assert found is not None and abs(found.objective_s - best) <= 1e-12 * best


def chain_seconds(cost: CostModel, stages, micro_batch: int) -> float:
    """Sum of stage times and hops of a plan: what ``sum_partition`` minimises."""
    devices = [cost.device(s.device) for s in stages]
    return (sum(cost.decode_s(d, s, micro_batch) for d, s in zip(devices, stages))
            + sum(cost.hop_s(a, b, micro_batch) for a, b in itertools.pairwise(devices)))


# '*': the card joins its node's NVLink island, so a hop past a skipped device can be faster than
# the hops to and from it.
bridged_cards = st.lists(st.sampled_from(sorted(CARDS) + [c + "*" for c in sorted(CARDS)]), min_size=1,
                         max_size=5)


@settings(max_examples=150, deadline=None)
@given(cards=bridged_cards, layer_sizes=sizes, batch=st.integers(1, 16), two_nodes=st.booleans(),
       share=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_chain_equals_brute_force_over_the_order(cards, layer_sizes, batch, two_nodes, share):
    """One micro-batch: the least sum of stage times and hops of any plan over the given order (any
    devices skipped, any boundaries and precisions) within the budget, with the fewest low-bit
    layers such plans have."""
    request, cost = instance(cards, layer_sizes, batch, two_nodes, share)
    devices = list(request.fleet.devices)
    budget = request.quantized_layer_budget
    found = sum_partition(cost, devices, batch, budget, request.bits)
    times, quantized = chain_plans(cost, devices, batch, budget)
    if not len(times):
        assert found is None
        return
    best = float(times.min())
    assert found is not None
    assert found.objective_s == pytest.approx(best, rel=1e-9)
    assert found.objective_s == pytest.approx(chain_seconds(cost, found.stages, batch), rel=1e-9)
    assert found.quantized == quantized_layers(found.stages) == quantized[times <= best * (1 + 1e-9)].min()
    bounds = [0] + [s.end for s in found.stages]
    assert [s.start for s in found.stages] == bounds[:-1] and bounds[-1] == cost.num_layers
    positions = [[d.name for d in devices].index(s.device) for s in found.stages]
    assert positions == sorted(set(positions))


def test_chain_spends_the_whole_budget():
    """A 13B-like model on two RTX 3090s, 8 sequences in one micro-batch: 20 of 40 layers at 4 bits,
    exactly the budget, is the fastest chain (222 tokens/s). A Lagrange penalty bisected over the chain
    search finds no value between more low-bit layers than allowed and none, and returns
    [0, 17) + [17, 40) at 16 bits (165 tokens/s): the exact search must not."""
    request = PlanRequest(fleet({"n": ["3090", "3090"]}),
                          profile(40, hidden=5120, layer_params=317_000_000, kv_bytes=2 * 2 * 5120),
                          Workload(batch=8, context=2048))
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    budget = request.quantized_layer_budget
    found = sum_partition(cost, devices, 8, budget, request.bits)
    times, _ = chain_plans(cost, devices, 8, budget)
    assert found.objective_s == pytest.approx(times.min(), rel=1e-9)
    assert found.quantized == budget == 20
    heuristic = (Placement("n/gpu0", 0, 17, 16), Placement("n/gpu1", 17, 40, 16))
    assert round_seconds(cost, heuristic, 1) > 1.3 * round_seconds(cost, found.stages, 1)


def test_a_split_stage_slower_than_every_one_precision_stage_is_found():
    """One RTX 3090 cannot hold this model at 16 bits, nor all of it at 4 bits within the budget;
    the only plan, [0, 2) at 16 and [2, 3) at 4 bits, takes longer than any stage of one precision
    that fits. The search's window of bottlenecks must reach it (it once stopped at the slowest
    one-precision stage and found nothing)."""
    model = profile(sizes=[1_684_000_000, 2_372_000_000, 2_244_000_000], vocab=32000)
    request = PlanRequest(fleet({"n0": ["3090"]}), model, Workload(batch=64, context=8192), max_quantized=0.5)
    cost = CostModel(request)
    devices = list(request.fleet.devices)
    found = bottleneck_partition(cost, devices, 1, request.quantized_layer_budget, request.bits,
                                 exact_order=True)
    best, fewest = brute_force(cost, devices, 1, request.quantized_layer_budget)
    assert found is not None and found.objective_s == pytest.approx(best, rel=1e-12)
    assert found.quantized == fewest
    (stage,) = found.stages
    assert stage.low_bits is not None and stage.segments[0][2] == 16
