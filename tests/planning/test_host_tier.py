"""The host KV tier, priced per pipeline: copying a token's KV back over the card's PCIe link against
prefilling it again, with figures worked out here from the spec sheets, not from the cost model."""

from __future__ import annotations

import json
import re

import pytest

from contracts.hardware import GIB
from controlplane.planning import PlanRequest, Workload, plan, plan_from_dict, plan_to_dict
from controlplane.planning.cost_model import LAYER_OVERHEAD_S, PREFILL_COMPUTE_EFFICIENCY
from controlplane.planning.validate import check
from tests.planning.factories import fleet, profile

LAYERS, KV_PER_LAYER, LAYER_PARAMS = 8, 8192, 200_000_000
PROMPT = 1024


def request(cards: list[str], host_gib: float, **pcie) -> PlanRequest:
    health = {f"n/gpu{i}": pcie for i in range(len(cards))}
    return PlanRequest(fleet({"n": cards}, health=health),
                       profile(LAYERS, layer_params=LAYER_PARAMS, kv_bytes=KV_PER_LAYER),
                       Workload(batch=1, context=2 * PROMPT, prompt_tokens=PROMPT), replicas=1,
                       bits=(16,), host_kv_bytes=int(host_gib * GIB))


def one_card_prices(tflops: float, link_gbs: float) -> tuple[float, float]:
    """(copy, recompute) seconds per token of the whole model on one card, by hand: the KV of all
    layers over the link; the prompt's FLOPs (layers, attention over half the prompt on average, the
    head once) at 60 % of the card's peak, plus the fixed cost per layer, spread over the prompt."""
    hidden, vocab = 4096, 32000
    flops = (PROMPT * LAYERS * 2 * LAYER_PARAMS + LAYERS * 4 * hidden * PROMPT * PROMPT / 2
             + 2 * vocab * hidden)
    prefill = flops / (tflops * 1e12 * PREFILL_COMPUTE_EFFICIENCY) + LAYERS * LAYER_OVERHEAD_S
    return LAYERS * KV_PER_LAYER / (link_gbs * 1e9), prefill / PROMPT


def tier_line(result) -> tuple[float, float, str]:
    line = next(x for x in result.explanation if x.startswith("Host KV tier"))
    copy, recompute, state = re.match(
        r"Host KV tier: copy back ([\d.e+-]+) ms/token against recompute ([\d.e+-]+) ms/token: (on|off)",
        line).groups()
    return float(copy) / 1e3, float(recompute) / 1e3, state


def test_an_old_card_with_slow_prefill_and_a_fast_link_gets_the_tier():
    result = plan(request(["P40"], host_gib=1.0))  # 12 TFLOPs, PCIe gen4 x16
    copy, recompute = one_card_prices(12, 0.985 * 2 * 16)
    assert copy < recompute / 100
    (stage,) = result.replicas[0].stages
    assert stage.host_kv_tokens == GIB // (LAYERS * KV_PER_LAYER) == 16384
    shown_copy, shown_recompute, state = tier_line(result)
    assert state == "on"
    assert shown_copy == pytest.approx(copy, rel=1e-3)
    assert shown_recompute == pytest.approx(recompute, rel=1e-3)


def test_a_fast_card_behind_a_slow_link_recomputes():
    result = plan(request(["A100"], host_gib=1.0, pcie_gen=3, pcie_lanes=1))  # 312 TFLOPs, 0.985 GB/s
    copy, recompute = one_card_prices(312, 0.985)
    assert copy > 2 * recompute
    (stage,) = result.replicas[0].stages
    assert stage.host_kv_tokens == 0 and stage.memory.host_kv_bytes == 0
    shown_copy, shown_recompute, state = tier_line(result)
    assert state == "off"
    assert shown_copy == pytest.approx(copy, rel=1e-3)
    assert shown_recompute == pytest.approx(recompute, rel=1e-3)


def test_no_host_memory_no_tier_however_cheap_the_copy():
    result = plan(request(["P40"], host_gib=0))
    assert result.replicas[0].stages[0].host_kv_tokens == 0
    assert any(line.endswith("off (no host memory granted per stage).") for line in result.explanation)


def test_every_stage_gets_the_same_budget_whatever_the_split_counted_apart_from_device_memory():
    """Two stages of unequal length hold as many tokens as one stage of the whole model would (no
    stage's own budget is smaller), each stage's host bytes that many tokens of its own layers' KV,
    outside its device total."""
    edited = {"replicas": [{"stages": [{"device": "n/gpu0", "layers": [0, 3], "bits": 16},
                                       {"device": "n/gpu1", "layers": [3, LAYERS], "bits": 16}]}]}
    tiered, bare = [check(edited, request(["P40", "P40"], host_gib=gib))[1] for gib in (1.0, 0)]
    stages = tiered.replicas[0].stages
    longest = LAYERS - 3
    expected = GIB // (LAYERS * KV_PER_LAYER)
    assert [s.host_kv_tokens for s in stages] == [expected, expected]
    for stage, without in zip(stages, bare.replicas[0].stages):
        assert stage.memory.host_kv_bytes == expected * (stage.end - stage.start) * KV_PER_LAYER <= GIB
        assert stage.memory.total_bytes == without.memory.total_bytes
    copy, _, state = tier_line(tiered)
    assert state == "on"  # the slowest stage's copy: the longer stage's KV over its link
    assert copy == pytest.approx(longest * KV_PER_LAYER / (0.985 * 2 * 16 * 1e9), rel=1e-3)


def test_the_stored_plan_carries_the_tier():
    result = plan(request(["P40"], host_gib=1.0))
    data = json.loads(json.dumps(plan_to_dict(result)))
    stage = data["replicas"][0]["stages"][0]
    assert stage["host_kv_tokens"] == 16384 and stage["memory"]["host_kv_bytes"] == GIB
    assert plan_from_dict(data) == result
    del stage["host_kv_tokens"], stage["memory"]["host_kv_bytes"]
    assert plan_from_dict(data).replicas[0].stages[0].host_kv_tokens == 0
