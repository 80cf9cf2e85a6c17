"""The planner's choices on hand-made fleets: precision as equalizer, health, pins, replicas, limits."""

from __future__ import annotations

import pytest

from contracts.hardware import GIB
from controlplane.planning import Pin, PlanningError, PlanRequest, Workload, baseline_plan, plan, validate
from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.quality_budget import THROUGHPUT_TOLERANCE
from tests.planning.factories import fleet, profile


def devices_of(result):
    return [[s.device for s in r.stages] for r in result.replicas]


def test_old_small_card_carries_its_share_at_low_bits():
    request = PlanRequest(fleet({"n": ["A10", "T4"]}), profile(32), Workload(8, 2048), replicas=1)
    result = plan(request)
    stages = {s.gpu_model: s for s in result.replicas[0].stages}
    t4, a10 = stages["T4"], stages["A10"]
    assert t4.quantized_layers / (t4.end - t4.start) > a10.quantized_layers / (a10.end - a10.start)
    assert any("T4" in line and "bits" in line for line in result.explanation)
    # The bottleneck is no worse than either baseline over the same devices.
    for kind in ("even", "memory"):
        other = baseline_plan(request, kind)
        assert result.predicted.decode_tokens_per_s >= other.predicted.decode_tokens_per_s


def test_one_card_spends_the_budget_on_part_of_its_layers():
    """Decode of 4 sequences reads the weights every step: half the layers at 4 bits, the most the
    budget allows, in the stage's last layers (one card cannot hold two stages)."""
    result = plan(PlanRequest(fleet({"n": ["A100"]}), profile(16), Workload(4, 1024), replicas=1))
    (stage,) = result.replicas[0].stages
    assert (stage.bits, stage.low_bits, stage.low_from) == (16, 4, 8)
    assert stage.segments == ((0, 8, 16), (8, 16, 4)) and result.quantized_layers == 8
    assert any("[8, 16) at 4 bits" in line for line in result.explanation)
    assert any("layers [0, 16), 16-bit, 4-bit from layer 8)" in line for line in result.explanation)
    whole = plan(PlanRequest(fleet({"n": ["A100"]}), profile(16), Workload(4, 1024), replicas=1,
                             max_quantized=0.0))
    assert result.predicted.decode_tokens_per_s > 1.3 * whole.predicted.decode_tokens_per_s


def test_no_low_bits_when_they_buy_nothing():
    """512 sequences of 64 tokens: the step is bound by compute, which fewer weight bytes do not cut."""
    result = plan(PlanRequest(fleet({"n": ["A100"]}), profile(16), Workload(512, 64), replicas=1))
    assert result.bottleneck.resource == "compute"
    assert [(s.bits, s.low_bits) for s in result.replicas[0].stages] == [(16, None)]
    assert result.quantized_layers == 0


def test_quality_budget_zero_keeps_every_layer_at_16_bits():
    result = plan(PlanRequest(fleet({"n": ["A10", "T4", "P40"]}), profile(32), Workload(8, 2048),
                              max_quantized=0.0))
    assert all(s.bits == 16 for r in result.replicas for s in r.stages)


def test_down_throttled_and_busy_devices():
    health = {"n/gpu0": {"down": True}, "n/gpu1": {"memory_used_bytes": 20 * GIB}}
    request = PlanRequest(fleet({"n": ["A100", "A100", "A100"]}, health=health), profile(32),
                          Workload(8, 2048))
    result = plan(request)
    used = {d for r in devices_of(result) for d in r}
    assert "n/gpu0" not in used
    assert dict(result.unused_devices)["n/gpu0"] == "down"
    busy = next(s for r in result.replicas for s in r.stages if s.device == "n/gpu1")
    idle = CostModel(request).memory(request.fleet.device("n/gpu2"), Placement("n/gpu2", 0, 1, 16))
    assert busy.memory.capacity_bytes < idle.capacity_bytes
    throttled = fleet({"n": ["A100", "A100"]}, health={"n/gpu0": {"throttle_factor": 0.5}})
    slow, fast = (plan(PlanRequest(throttled, profile(32), Workload(8, 2048), exclude_devices=(name,),
                                   replicas=1))
                  for name in ("n/gpu1", "n/gpu0"))
    assert slow.predicted.decode_tokens_per_s == pytest.approx(fast.predicted.decode_tokens_per_s / 2,
                                                               rel=0.02)


def test_calibration_scales_predictions():
    base = plan(PlanRequest(fleet({"n": ["A100"]}), profile(16), Workload(4, 1024)))
    slower = plan(PlanRequest(fleet({"n": ["A100"]}, health={"n/gpu0": {"calibration": 2.0}}), profile(16),
                              Workload(4, 1024)))
    assert slower.predicted.token_latency_ms == pytest.approx(2 * base.predicted.token_latency_ms, rel=1e-3)


def test_a_replica_leaves_a_node_only_when_that_pays():
    """A T4 on node a, two V100s on node b, 32 sequences (three micro-batches): V100 -> T4 -> V100 is
    as fast as keeping the V100s together, at twice the network hops. (With 8 sequences one
    micro-batch through the two V100s alone is fastest.)"""
    request = PlanRequest(fleet({"a": ["T4"], "b": ["V100", "V100"]}), profile(16), Workload(32, 2048),
                          replicas=1)
    result = plan(request)
    stages = result.replicas[0].stages
    assert [s.node for s in stages] in (["a", "b", "b"], ["b", "b", "a"])
    assert [s.link for s in stages].count("network") == 1
    assert any("1 network hop(s)" in line for line in result.explanation)
    there_and_back = [("b/gpu1", 0, 6, 16), ("a/gpu0", 6, 8, 16), ("b/gpu0", 8, 16, 8)]
    report = validate({"replicas": [{"micro_batches": result.replicas[0].micro_batches, "stages": [
        {"device": d, "layers": [start, end], "bits": bits} for d, start, end, bits in there_and_back]}]},
        request)
    assert report.ok
    tokens = report.predicted.decode_tokens_per_s
    assert result.predicted.decode_tokens_per_s >= (1.0 - THROUGHPUT_TOLERANCE) * tokens


def test_excluded_node_and_pin():
    layout = {"a": ["A10", "A10"], "b": ["A10", "A10"]}
    result = plan(PlanRequest(fleet(layout), profile(24), Workload(8, 2048), exclude_nodes=("b",)))
    assert all(d.startswith("a/") for r in devices_of(result) for d in r)
    pinned = plan(PlanRequest(fleet(layout), profile(24), Workload(8, 2048), replicas=1,
                              pins=(Pin("b/gpu1", 0, 5),)))
    first = pinned.replicas[0].stages[0]
    assert (first.device, first.start, first.end) == ("b/gpu1", 0, 5)


def test_auto_replicas_raise_throughput_over_one():
    request = PlanRequest(fleet({"n": ["A100"] * 4}), profile(32), Workload(8, 2048))
    auto = plan(request)
    single = plan(PlanRequest(request.fleet, request.model, request.workload, replicas=1))
    assert len(auto.replicas) > 1
    assert auto.predicted.decode_tokens_per_s > single.predicted.decode_tokens_per_s


def test_latency_objective_never_slower_between_tokens():
    layout = {"a": ["A100", "T4"], "b": ["3090", "P40"]}
    latency = plan(PlanRequest(fleet(layout), profile(32), Workload(8, 2048), objective="latency"))
    throughput = plan(PlanRequest(fleet(layout), profile(32), Workload(8, 2048)))
    assert latency.predicted.token_latency_ms <= throughput.predicted.token_latency_ms
    assert throughput.predicted.decode_tokens_per_s >= latency.predicted.decode_tokens_per_s


def test_infeasible_model_reports_the_shortfall():
    with pytest.raises(PlanningError) as raised:
        plan(PlanRequest(fleet({"n": ["T4", "T4"]}), profile(80, layer_params=800_000_000),
                         Workload(8, 4096)))
    message = str(raised.value)
    assert "short by" in message and "GiB" in message
    assert "Even with every layer at 4 bits" in message  # larger than the fleet even at int4


def test_infeasible_partition_is_explained():
    # One layer alone exceeds every card, though the total would fit.
    with pytest.raises(PlanningError, match="no partition fits"):
        plan(PlanRequest(fleet({"n": ["T4"] * 8}), profile(2, layer_params=12_000_000_000), Workload(1, 128),
                         bits=(16, 8)))


def test_everything_down():
    with pytest.raises(PlanningError, match="no usable device"):
        plan(PlanRequest(fleet({"n": ["A100"]}, health={"n/gpu0": {"down": True}}), profile(8)))


def test_without_16_bits_every_layer_is_low_bit():
    result = plan(PlanRequest(fleet({"n": ["A10"]}), profile(8), Workload(2, 512), bits=(8, 4),
                              max_quantized=0.0))
    assert {s.bits for r in result.replicas for s in r.stages} <= {8, 4}


def test_pins_on_a_fleet_beyond_the_exact_order_search():
    layout = {"a": ["A10"] * 4, "b": ["A10"] * 4}
    pins = (Pin("a/gpu0", 20, 24), Pin("b/gpu2", 0, 3))
    result = plan(PlanRequest(fleet(layout), profile(24), Workload(8, 2048), replicas=1, pins=pins))
    stages = {s.device: (s.start, s.end) for s in result.replicas[0].stages}
    assert stages["a/gpu0"] == (20, 24) and stages["b/gpu2"] == (0, 3)
