"""Speculative decoding in the planner's predicted tokens/s, with figures worked out here by hand."""

from __future__ import annotations

import pytest

from contracts.speculation import expected_tokens
from controlplane.planning import PlanningError, PlanRequest, Workload, plan
from controlplane.planning.cost_model import BANDWIDTH_EFFICIENCY
from controlplane.planning.speculation import Speculation, speculation_figures
from tests.planning.factories import CARDS, fleet, profile

LAYERS, KV_PER_LAYER = 8, 8192
CONTEXT, PROMPT = 2048, 1024


def request(card: str, batch: int, speculation: Speculation = Speculation()) -> PlanRequest:
    return PlanRequest(fleet({"n": [card]}), profile(LAYERS, kv_bytes=KV_PER_LAYER),
                       Workload(batch=batch, context=CONTEXT, prompt_tokens=PROMPT), replicas=1, bits=(16,),
                       speculation=speculation)


@pytest.mark.parametrize(("acceptance", "proposals", "expected"), [
    (0.5, 4, 1 + 0.5 + 0.25 + 0.125 + 0.0625),
    (0.8, 2, 1 + 0.8 + 0.64),
    (1.0, 4, 5.0),
    (0.0, 4, 1.0),
    (0.5, 0, 1.0),
])
def test_expected_tokens_per_step(acceptance, proposals, expected):
    assert expected_tokens(acceptance, proposals) == pytest.approx(expected)


def test_the_prior_until_measured_and_the_figures_of_two_rounds():
    assert (Speculation("lookup").acceptance, Speculation("lookup").source) == (0.5, "prior")
    measured = Speculation("lookup", 4, 0.8)
    assert (measured.acceptance, measured.source) == (0.8, "measured")
    figures = speculation_figures(Speculation("lookup", 4), batch=2, plain_round_s=0.010,
                                  speculative_round_s=0.012)
    assert figures.plain_tokens_per_s == pytest.approx(200.0)  # 2 sequences / 10 ms
    assert figures.speculative_tokens_per_s == pytest.approx(2 * 1.9375 / 0.012)  # 322.9
    assert figures.pays and figures.tokens_per_s == figures.speculative_tokens_per_s
    slow = speculation_figures(Speculation("lookup", 4), batch=2, plain_round_s=0.010,
                               speculative_round_s=0.05)
    assert not slow.pays and slow.tokens_per_s == pytest.approx(200.0)  # 2 x 1.9375 / 50 ms = 77.5
    drafted = speculation_figures(Speculation("draft", 4, propose_s=0.004), batch=2, plain_round_s=0.010,
                                  speculative_round_s=0.012)  # the round waits 4 ms for the draft model
    assert drafted.speculative_round_s == pytest.approx(0.016)
    assert drafted.speculative_tokens_per_s == pytest.approx(2 * 1.9375 / 0.016)  # 242.2


def test_a_memory_bound_card_at_batch_1_gains_almost_the_expected_tokens():
    """One A100, batch 1: the step reads the weights once whatever k; only the KV read grows, by
    4 x 8 layers x 8192 bytes x the mean context of 1536 tokens, at the card's usable bandwidth."""
    off = plan(request("A100", 1))
    on = plan(request("A100", 1, Speculation("lookup", 4)))
    assert [s.layers for s in on.replicas[0].stages] == [s.layers for s in off.replicas[0].stages]
    plain_round = 1 / off.predicted.decode_tokens_per_s
    usable = CARDS["A100"][1] * 1e9 * BANDWIDTH_EFFICIENCY
    extra = 4 * LAYERS * KV_PER_LAYER * (CONTEXT + PROMPT) / 2 / usable
    assert on.predicted.decode_tokens_per_s == pytest.approx(1.9375 / (plain_round + extra), rel=1e-9)
    assert on.predicted.token_latency_ms == pytest.approx((plain_round + extra) / 1.9375 * 1e3, rel=1e-9)
    assert on.predicted.round_ms == pytest.approx(off.predicted.round_ms)  # the round of one position
    line = next(line for line in on.explanation if line.startswith("Speculation"))
    assert "lookup, up to 4 proposals per step, acceptance 0.50 assumed" in line
    assert "1.94 tokens per sequence and step" in line and "the predicted tokens/s count it" in line
    assert not any(line.startswith("Speculation") for line in off.explanation)


def test_a_measured_acceptance_replaces_the_prior():
    low = plan(request("A100", 1, Speculation("lookup", 4, 0.2)))
    line = next(line for line in low.explanation if line.startswith("Speculation"))
    assert "acceptance 0.20 measured" in line and f"{1 + 0.2 + 0.04 + 0.008 + 0.0016:.2f} tokens" in line


def test_where_it_does_not_pay_the_prediction_is_without_it():
    """A P40 at batch 64 is compute bound: 5 positions per sequence cost nearly 5 times a step, more
    than 1.94 tokens per step win back."""
    off = plan(request("P40", 64))
    on = plan(request("P40", 64, Speculation("lookup", 4)))
    assert on.predicted.decode_tokens_per_s == pytest.approx(off.predicted.decode_tokens_per_s)
    line = next(line for line in on.explanation if line.startswith("Speculation"))
    assert "it does not pay here" in line


def test_a_bad_speculation_is_refused():
    with pytest.raises(PlanningError, match="speculation"):
        request("A100", 1, Speculation("lookup", 4, 1.5))
