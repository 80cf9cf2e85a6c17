"""Where the speculative-decoding draft model runs (draft.py): the brute force over every (card, bits),
the topology against the draft's weight, its quality budget, refusals, and one price worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from contracts.footprint import stage_footprint, usable_bytes
from contracts.hardware import GIB, LinkSpec
from contracts.precision import Precision
from controlplane.planning import Placement, PlanningError, PlanRequest, Workload, plan
from controlplane.planning.cost_model import CostModel
from controlplane.planning.draft import place_draft
from controlplane.planning.ordering import speed
from controlplane.planning.plan import Share
from tests.planning.factories import CARDS, fleet, profile

TARGET = profile(8, name="target")  # 8 x 200M-parameter layers: 3.2 GB at 16 bits
DRAFT = profile(4, hidden=1024, layer_params=25_000_000, kv_bytes=4096, name="draft")
WORKLOAD = Workload(batch=1, context=2048, prompt_tokens=1024)


def with_sensitivity(model, kl8: float, kl4: float):
    return replace(model, sensitivity={8: (kl8,) * model.num_layers, 4: (kl4,) * model.num_layers})


def slow_link(spec, a: str, b: str, latency_us: float):
    return replace(spec, links=(LinkSpec(a, b, "network", 12.5, latency_us),))


def brute_force(request: PlanRequest, placements, draft, proposals: int):
    """Every (card, bits) priced from the primitives, the best by the documented order."""
    cost = CostModel(replace(request, model=draft, max_kl=None))
    used = {p.device for replica in placements for p in replica}
    head = request.fleet.device(placements[0][0].device)
    best = None
    for device in request.fleet.devices:
        if request.excluded_reason(device) is not None or device.name in used:
            continue
        for bits in request.bits:
            if bits < 16 and request.max_kl is not None:
                measured = draft.sensitivity.get(bits)
                if measured is None and bits != 8:
                    continue
                if measured is not None and sum(measured) > request.max_kl:
                    continue
            footprint = stage_footprint(draft, 0, draft.num_layers, Precision(bits),
                                        batch=request.workload.batch)
            if footprint.kv_tokens_within(usable_bytes(device)) < request.workload.kv_tokens_required:
                continue
            whole = Placement(device.name, 0, draft.num_layers, bits)
            trip = 0.0 if device is head else 2e-6 * request.fleet.link_between(device, head).latency_us
            propose = proposals * cost.decode_s(device, whole, 1) + trip
            key = (propose, device.node != head.node, speed(device), device.name, -bits)
            best = min(best or key, key)
    return best


CASES = [
    # (layout, target placements, link latency between a and b (None: the default), request options)
    ({"a": ["A100", "T4", "3090"], "b": ["A10", "V100"]}, [[("a/gpu0", 0, 8)]], None, {}),
    ({"a": ["A100", "T4", "3090"], "b": ["A10", "V100"]}, [[("a/gpu0", 0, 8)]], 5000.0, {}),
    ({"a": ["A100", "A100"], "b": ["T4", "P40"], "c": ["3090"]},
     [[("a/gpu0", 0, 8)], [("a/gpu1", 0, 4), ("b/gpu1", 4, 8)]], None, {"exclude_nodes": ("c",)}),
    ({"a": ["A10", "T4", "T4"], "b": ["T4"]}, [[("a/gpu0", 0, 8)]], 2000.0, {"bits": (16, 8)}),
    ({"a": ["V100", "P40"], "b": ["3090", "A10"]}, [[("b/gpu0", 0, 8)]], None,
     {"exclude_devices": ("b/gpu1",), "workload": Workload(batch=64, context=8192)}),
]


@pytest.mark.parametrize("proposals", [1, 4, 8])
@pytest.mark.parametrize("draft", [DRAFT, profile(12, name="heavy draft"),
                                   with_sensitivity(profile(16, name="measured draft"), 0.001, 0.02)])
@pytest.mark.parametrize("max_kl", [None, 0.1, 1.0])
@pytest.mark.parametrize(("layout", "target", "latency_us", "options"), CASES)
def test_the_chosen_card_and_bits_are_the_brute_force_optimum(layout, target, latency_us, options, max_kl,
                                                               draft, proposals):
    spec = fleet(layout)
    if latency_us is not None:
        spec = slow_link(spec, "a", "b", latency_us)
    options = {"workload": WORKLOAD, **options}
    model = with_sensitivity(TARGET, 0.001, 0.01) if max_kl is not None else TARGET
    request = PlanRequest(spec, model, max_kl=max_kl, **options)
    placements = [[Placement(d, s, e, 16) for d, s, e in replica] for replica in target]
    expected = brute_force(request, placements, draft, proposals)
    if expected is None:
        with pytest.raises(PlanningError):
            place_draft(request, placements, draft, proposals)
        return
    chosen = place_draft(request, placements, draft, proposals)
    assert chosen.propose_s == pytest.approx(expected[0], rel=1e-12)
    assert (chosen.placement.device, -chosen.placement.bits) == (expected[3], expected[4])
    assert (chosen.placement.start, chosen.placement.end) == (0, draft.num_layers)
    assert chosen.kv_tokens >= request.workload.kv_tokens_required


def test_the_planner_s_own_replicas_are_taken_as_they_are():
    request = PlanRequest(fleet({"a": ["A100", "T4"], "b": ["A100"]}), TARGET, WORKLOAD, replicas=1)
    target = plan(request)
    used = {s.device for r in target.replicas for s in r.stages}
    chosen = place_draft(request, target.replicas, DRAFT, 4)
    assert chosen.placement.device not in used
    placements = [[s.placement for s in r.stages] for r in target.replicas]
    assert chosen == place_draft(request, placements, DRAFT, 4)


def test_an_old_card_by_the_head_beats_a_fast_one_across_a_slow_link():
    """5 ms each way to node b: a T4 next to the head proposes 4 tokens of the small draft in ~5 ms, an
    A100 on b in ~1 ms plus a 10 ms round trip."""
    spec = slow_link(fleet({"a": ["A100", "T4"], "b": ["A100"]}), "a", "b", 5000.0)
    request = PlanRequest(spec, TARGET, WORKLOAD, bits=(16,))
    chosen = place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 4)
    assert chosen.placement.device == "a/gpu1"
    assert chosen.round_trip_s == pytest.approx(10e-6)  # PCIe, 5 us each way
    assert "the head's node" in chosen.reasons[0]
    assert any(line.startswith("Alternatives: b/gpu0 at 16 bits") for line in chosen.reasons)


def test_a_heavy_draft_goes_to_the_fast_card_across_the_link():
    """A 2B-parameter draft: 4 GB a step, ~16 ms on the T4 and ~2.5 ms on the A100; 4 proposals cost the
    T4 ~63 ms and the A100 ~10 ms plus the 10 ms round trip."""
    spec = slow_link(fleet({"a": ["A100", "T4"], "b": ["A100"]}), "a", "b", 5000.0)
    request = PlanRequest(spec, TARGET, WORKLOAD, bits=(16,))
    heavy = profile(10, name="2B draft")
    chosen = place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], heavy, 4)
    assert chosen.placement.device == "b/gpu0"
    assert chosen.round_trip_s == pytest.approx(10e-3)
    assert "not the head's (a)" in chosen.reasons[0]


def test_equal_cards_go_to_the_head_s_node_then_to_the_slower_card():
    spec = fleet({"a": ["A100", "A10"], "b": ["A10", "T4"]})
    spec = replace(spec, links=(LinkSpec("a", "b", "network", 12.5, 5.0),))  # as fast as PCIe
    request = PlanRequest(spec, TARGET, WORKLOAD, bits=(16,))
    chosen = place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 1)
    assert chosen.placement.device == "a/gpu1"  # b/gpu0 proposes as fast, a/gpu1 is by the head
    # Two T4s at one price; a/gpu2's calibration makes it the slower card (``ordering.speed``) but it
    # was measured at 16 bits at the spec sheet's speed, which is what prices the draft.
    spec = fleet({"a": ["A100", "T4", "T4"]},
                 health={"a/gpu2": {"calibration": 2.0, "calibration_by_bits": ((16, 1.0),)}})
    chosen = place_draft(PlanRequest(spec, TARGET, WORKLOAD, bits=(16,)), [[Placement("a/gpu0", 0, 8, 16)]],
                         DRAFT, 1)
    assert chosen.placement.device == "a/gpu2"
    twins = fleet({"a": ["A100", "T4", "T4"]})
    chosen = place_draft(PlanRequest(twins, TARGET, WORKLOAD, bits=(16,)), [[Placement("a/gpu0", 0, 8, 16)]],
                         DRAFT, 1)
    assert chosen.placement.device == "a/gpu1"  # same price, same speed: by name
    assert "as fast as a/gpu2" in chosen.reasons[2]


def test_int4_when_it_proposes_faster_and_the_budget_allows():
    spec = fleet({"a": ["A100", "T4"]})
    draft = with_sensitivity(DRAFT, 0.001, 0.01)  # 4 layers: 0.004 at 8 bits, 0.04 at 4 bits
    target = with_sensitivity(TARGET, 0.001, 0.01)
    placements = [[Placement("a/gpu0", 0, 8, 16)]]
    loose = place_draft(PlanRequest(spec, target, WORKLOAD, max_kl=0.05), placements, draft, 4)
    assert (loose.placement.device, loose.placement.bits) == ("a/gpu1", 4)
    assert "at 4 bits" in loose.reasons[0]
    tight = place_draft(PlanRequest(spec, target, WORKLOAD, max_kl=0.01), placements, draft, 4)
    assert tight.placement.bits == 8 and tight.propose_s > loose.propose_s
    assert "4 bits refused: the draft's measured KL there sums to 0.04, over max_kl 0.01." in tight.reasons
    strict = place_draft(PlanRequest(spec, target, WORKLOAD, max_kl=0.001), placements, draft, 4)
    assert strict.placement.bits == 16
    free = place_draft(PlanRequest(spec, TARGET, WORKLOAD), placements, DRAFT, 4)
    assert free.placement.bits == 4  # no max_kl: every precision of the request


def test_without_a_measured_kl_the_draft_runs_at_8_bits_at_most():
    spec = fleet({"a": ["A100", "T4"]})
    request = PlanRequest(spec, with_sensitivity(TARGET, 0.001, 0.01), WORKLOAD, max_kl=1.0)
    chosen = place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 4)
    assert chosen.placement.bits == 8
    assert any(line.startswith("4 bits refused: no measured KL of the draft") for line in chosen.reasons)
    assert any(line.startswith("8 bits allowed without a measured KL") for line in chosen.reasons)


def test_no_spare_card_names_each_card_s_reason():
    spec = fleet({"a": ["A100", "T4", "T4"], "b": ["A10"]}, health={"a/gpu1": {"down": True}})
    request = PlanRequest(spec, TARGET, WORKLOAD, exclude_nodes=("b",))
    big = profile(40, layer_params=1_000_000_000, name="big draft")  # 20 GB at 4 bits: no T4 holds it
    with pytest.raises(PlanningError) as error:
        place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], big, 4)
    message = str(error.value)
    assert "no card can serve big draft" in message
    assert "a/gpu0: carries a stage of the target" in message
    assert "a/gpu1: down" in message
    assert "a/gpu2: too small at every allowed precision" in message
    assert "b/gpu0: node b excluded by the operator" in message
    with pytest.raises(PlanningError, match="a/gpu0: carries a stage of the target"):
        place_draft(PlanRequest(fleet({"a": ["A100"]}), TARGET, WORKLOAD), [[Placement("a/gpu0", 0, 8, 16)]],
                    DRAFT, 4)
    with pytest.raises(PlanningError, match="proposals 0 must be at least 1"):
        place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 0)


def test_every_rank_of_a_tensor_parallel_group_carries_the_target():
    """The draft never lands on a card a rank of the target's group holds, not only the group's first."""
    request = PlanRequest(fleet({"a": ["A100", "A100", "T4"]}), TARGET, WORKLOAD)
    group = (Share("a/gpu0", 4, 4096, 16), Share("a/gpu1", 4, 4096, 16))
    placed = place_draft(request, [[Placement("a/gpu0", 0, 8, 16, group=group)]], DRAFT, 4)
    assert placed.placement.device == "a/gpu2"


def test_the_batch_s_kv_must_fit_the_draft_s_card():
    """A T4 with 14 GiB taken by others keeps ~0.8 GiB for stages: the draft's weights fit, the KV of 64
    sequences x 8192 tokens (8 GiB) does not."""
    spec = fleet({"a": ["A100", "T4"]}, health={"a/gpu1": {"memory_used_bytes": 14 * GIB}})
    request = PlanRequest(spec, TARGET, Workload(batch=64, context=8192))
    too_small = r"a/gpu1: too small at every allowed precision \(.* GiB at 4 bits with 524288 tokens of KV"
    with pytest.raises(PlanningError, match=too_small):
        place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 4)


def test_propose_time_worked_by_hand():
    """The small draft at 16 bits on the T4 by the head (a/gpu0), batch 1, mean decode context
    (1024 + 2048) / 2 = 1536. A step reads 4 layers x 50 MB, the 65.5 MB head and 4 x 4096 B x 1536 of
    KV, at 320 GB/s x 0.8; its FLOPs take 9 us at 65 TFLOPS x 0.5, so it is memory bound; 20 us of
    overhead per layer. 4 proposals, and 5 us of PCIe latency each way."""
    request = PlanRequest(fleet({"a": ["A100", "T4"]}), TARGET, WORKLOAD, bits=(16,))
    chosen = place_draft(request, [[Placement("a/gpu0", 0, 8, 16)]], DRAFT, 4)
    read = 4 * 50_000_000 + 2 * 32000 * 1024 + 4 * 4096 * 1536  # 290,701,824 bytes
    flops_s = (4 * 2 * 25_000_000 + 2 * 32000 * 1024 + 4 * 4 * 1024 * 1536) / (65e12 * 0.5)
    assert flops_s < read / (320e9 * 0.8)
    step = read / (320e9 * 0.8) + 4 * 20e-6  # 1.2156 ms
    assert chosen.decode_s == pytest.approx(step, rel=1e-12)
    assert chosen.round_trip_s == pytest.approx(2 * 5e-6)
    assert chosen.propose_s == pytest.approx(4 * step + 10e-6, rel=1e-12)  # 4.8722 ms
    assert chosen.placement == Placement("a/gpu1", 0, 4, 16)
    # KV: the T4's usable memory less the weights (layers, head, 16-bit embedding) and the workspace (a
    # 512-token prefill chunk x 10 hidden states, the fp32 logits of one sequence), 16 KiB a token.
    usable = CARDS["T4"][0] * GIB - 0.05 * CARDS["T4"][0] * GIB - 384 * 1024**2
    weights = 4 * 50_000_000 + 2 * (2 * 32000 * 1024)
    workspace = 512 * 2 * 1024 * 10 + 4 * 32000
    assert chosen.kv_tokens == int((usable - weights - workspace) // (4 * 4096))
    assert chosen.reasons[0] == ("Draft model draft: a/gpu1 (T4, the head's node), all 4 layers at 16 bits; "
                                 "4.872 ms to propose 4 tokens for a sequence (4 x 1.216 ms decode steps + "
                                 "0.010 ms round trip to the head a/gpu0).")
