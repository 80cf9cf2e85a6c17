"""The head's proposals: prompt lookup finds the most recent earlier occurrence of the longest suffix;
the policy proposes while it pays by the measured step cost and the sequences' acceptance rates, and
nothing at low acceptance or large batches."""

from __future__ import annotations

import pytest

from contracts.sampling import SamplingParams
from worker_runtime.draft_client import ModelDrafter
from worker_runtime.frames import Frame, FrameError
from worker_runtime.prompt_lookup import PromptLookup
from worker_runtime.protocol import batch_from_frame, batch_message
from worker_runtime.scheduler import Request
from worker_runtime.speculation import Candidate, SpeculationPolicy, Speculator, StepCost, accepted_count
from worker_runtime.stage import Batch


def test_lookup_copies_what_followed_the_longest_most_recent_suffix():
    lookup = PromptLookup(ngram_max=3)
    text = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 1, 2, 3]
    # [1, 2, 3] occurred at the start (then 4); [2, 3] more recently (then 5): the longest wins
    assert lookup.propose(text, 3) == [4, 9, 2]
    text += [4]
    assert lookup.propose(text, 2) == [9, 2]  # [2, 3, 4] occurred once, then 9
    assert lookup.propose(text + [8], 4) == []  # 8 never occurred before
    assert PromptLookup().propose([5, 5, 5], 0) == []


def test_lookup_index_grows_with_the_sequence_and_matches_a_full_scan():
    lookup, tokens = PromptLookup(ngram_max=2), []
    for i in range(60):
        tokens.append((i * i) % 7)
        got = lookup.propose(tokens, 3)
        expected = []
        for n in (2, 1):
            if len(tokens) < n:
                continue
            ends = [e for e in range(n, len(tokens)) if tokens[e - n:e] == tokens[-n:]]
            if ends:
                expected = tokens[ends[-1]:ends[-1] + 3]
                break
        assert got == expected, i


def test_accepted_count_stops_at_the_first_rejection():
    assert accepted_count([4, 5, 6], [4, 5, 7, 8]) == 2
    assert accepted_count([4, 5, 6], [9, 5, 6, 8]) == 0
    assert accepted_count([4, 5, 6], [4, 5, 6, 1]) == 3


def test_step_cost_fits_fixed_and_per_token_seconds():
    cost = StepCost()
    for tokens in (1, 3, 5, 2, 8) * 4:
        cost.observe(tokens, 0.010 + 0.002 * tokens)
    fixed, per_token = cost.fit()
    assert fixed == pytest.approx(0.010) and per_token == pytest.approx(0.002)
    flat = StepCost()
    for _ in range(5):
        flat.observe(4, 0.02)
    assert flat.fit() == pytest.approx((0.02, 0.001))  # nothing to fit on: the prior share


def chosen(policy: SpeculationPolicy, rates: list[float], sequences: int, tokens: int) -> list[int]:
    candidates = [Candidate([1] * 8, rate) for rate in rates]
    policy.choose(candidates, sequences, tokens, token_room=1000)
    return [c.chosen for c in candidates]


def test_proposals_where_a_step_is_latency_bound_none_at_low_acceptance_or_large_batches():
    policy = SpeculationPolicy()
    for tokens in (1, 2, 5, 9) * 5:  # a cross-host pipeline at batch 1: 50 ms of hops, 0.5 ms a token
        policy.cost.observe(tokens, 0.050 + 0.0005 * tokens)
    # gain rate**j against 0.01 x expected tokens: proposals while the chance of reaching them pays
    assert chosen(policy, [0.9], 1, 1) == [8]
    assert chosen(policy, [0.5], 1, 1) == [5]
    assert chosen(policy, [0.005], 1, 1) == [0]
    assert chosen(policy, [0.9, 0.1], 2, 2) == [8, 1]
    assert chosen(policy, [0.5] * 256, 256, 256) == [0] * 256  # a large batch: a token slows 256 sequences
    compute_bound = SpeculationPolicy()
    for tokens in (1, 2, 5, 9) * 5:
        compute_bound.cost.observe(tokens, 0.002 + 0.001 * tokens)
    fixed, per_token = compute_bound.cost.fit()
    assert (fixed, per_token) == pytest.approx((0.002, 0.001))
    for rate in (0.3, 0.5, 0.7, 0.9, 0.99):  # one sequence: the brute-force best count
        best = max(range(9), key=lambda k: expected_tokens(rate, k) / (fixed + per_token * (1 + k)))
        assert chosen(compute_bound, [rate], 1, 1) == [best], rate
    assert chosen(compute_bound, [0.3], 1, 1) == [0] and chosen(compute_bound, [0.9], 1, 1) < [8]


def expected_tokens(rate: float, k: int) -> float:
    return sum(rate ** j for j in range(k + 1))


def test_the_fit_keeps_a_fixed_part_when_noise_tilts_it():
    cost = StepCost()
    for tokens, seconds in [(1, 0.001), (3, 0.030), (1, 0.0012), (2, 0.020)] * 3:
        cost.observe(tokens, seconds)
    fixed, per_token = cost.fit()
    mean = sum(s for _, s in [(1, 0.001), (3, 0.030), (1, 0.0012), (2, 0.020)]) / 4
    assert fixed == pytest.approx(0.25 * mean, rel=0.05) and per_token > 0
    policy = SpeculationPolicy()
    policy.cost = cost
    assert chosen(policy, [0.95], 1, 1)[0] >= 1  # a likely proposal is still tried, and tells the fit more


def test_acceptance_rates_follow_outcomes_and_new_sequences_start_from_all_of_them():
    policy = SpeculationPolicy()
    for _ in range(20):
        policy.verified(1, 4, 0)
    assert policy.acceptance(1) < 0.01 and policy.acceptance(2) < 0.2
    policy.verified(3, 4, 4)
    assert policy.acceptance(3) > policy.acceptance(2)


def test_speculator_caps_proposals_by_what_a_request_may_still_emit():
    speculator = Speculator(ceiling=6)
    request = Request("r", b"c", [1, 2, 3, 1, 2, 3, 1, 2, 3, 1], SamplingParams(), max_tokens=4, seq_id=7)
    request.output = [2]
    speculator.propose([request], max_batch_tokens=64)
    assert request.proposals == [3, 1]  # 4 - 1 emitted - 1 the step's own
    settled = speculator.settle([request], [7], [[3, 9, 5]], round_trip=(3, 0.01))
    assert settled == [[3, 9]] and request.proposals == []
    assert speculator.figures() == {"spec_drafts": 1, "spec_draft_tokens": 2, "spec_accepted_tokens": 1}
    opted_out = Request("s", b"c", [1, 1, 1], SamplingParams(), max_tokens=9, seq_id=8, speculate=False)
    opted_out.output = [1]
    speculator.propose([opted_out], max_batch_tokens=64)
    assert opted_out.proposals == []


def test_a_batch_frame_carries_its_logit_rows_and_refuses_bad_ones():
    batch = Batch.of_tokens([1, 2], [[5, 6, 7], [8]], [10, 3], logit_rows=[3, 1])
    header, tensors = batch_message(4, 9, batch, [SamplingParams()] * 2, batch.input_ids)
    parsed, _ = batch_from_frame(Frame(header, tensors), first_stage=True)
    assert parsed.logit_rows == [3, 1] and parsed.produced_positions() == [11, 12, 13, 4]
    assert parsed.per_sequence([21, 22, 23, 24]) == [[21, 22, 23], 24]
    for bad in ([4, 1], [3], [0, 1], "x"):
        with pytest.raises(FrameError, match="logits|malformed"):
            batch_from_frame(Frame({**header, "logits": bad}, tensors), first_stage=True)
    plain = Batch.of_tokens([1], [[5]], [0])
    assert "logits" not in batch_message(4, 9, plain, [SamplingParams()], plain.input_ids)[0]


def test_acceptance_counts_the_proposals_tested_not_those_after_the_first_rejection():
    """Four proposals at a 70 % chance each: the first rejection ends the count, so accepted over
    proposed would say about 44 % and stop proposals that pay; accepted over tested says 70 %."""
    policy = SpeculationPolicy()
    policy.verified(1, 4, 2)  # two accepted, the third rejected, the fourth never tested
    assert policy.acceptance(1) == pytest.approx((0.7 * 0.5 + 2) / (0.7 + 3))
    for _ in range(30):
        for accepted in (4, 2, 1, 4, 0, 3, 4, 2):  # 20 accepted of 24 tested (four rejections)
            policy.verified(2, 4, accepted)
    assert policy.acceptance(2) == pytest.approx(20 / 24, abs=0.05)


def test_a_sequence_that_proposes_nothing_learns_from_the_tokens_it_emits():
    """A proposal the policy did not send is checked against the step's token, for nothing: a sequence
    whose rate fell below what pays proposes again once its text turns to copying."""
    speculator = Speculator(ceiling=4)
    for tokens in (1, 2, 5) * 10:  # verifying costs: a token is as dear as half a step
        speculator.policy.cost.observe(tokens, 0.010 + 0.005 * tokens)
    request = Request("r", b"c", [1, 2, 3, 4, 1, 2, 3, 4], SamplingParams(), max_tokens=64, seq_id=5)
    request.output = [1]
    for _ in range(10):
        speculator.policy.verified(5, 4, 0)
    speculator.propose([request], max_batch_tokens=64)
    assert request.proposals == []  # the lookup proposes [2, 3, 4, 1]; at this rate they do not pay
    for _ in range(6):  # the text goes on copying itself: each unsent proposal was the step's token
        token = [1, 2, 3, 4][(len(request.prompt) + len(request.output)) % 4]
        assert speculator.settle([request], [5], [token], round_trip=(1, 0.015)) == [token]
        request.output.append(token)
        speculator.propose([request], max_batch_tokens=64)
    assert request.proposals  # proposing again
    assert speculator.figures()["spec_drafts"] == 0  # the checks of unsent proposals are not drafts


class NoLink:
    """A draft client that never connects (``ModelDrafter`` only needs its four calls here)."""

    address = "tcp://nowhere:1"

    def send(self, header):
        return False

    def receive(self):
        return []

    def close(self):
        pass


def test_a_draft_is_asked_for_only_as_far_as_its_wait_pays():
    policy = SpeculationPolicy()
    for tokens in (1, 2, 5, 9) * 5:  # a round trip of 20 ms and 1 ms a token
        policy.cost.observe(tokens, 0.020 + 0.001 * tokens)
    drafter = ModelDrafter(NoLink())
    assert drafter._paying(policy, Candidate([0] * 4, 0.8, chosen=4), 1) == 4  # not timed yet: ask
    drafter.token_s = 0.002  # 2 ms a drafted token: 4 tokens at 80 % pay for their 12 ms
    assert drafter._paying(policy, Candidate([0] * 4, 0.8, chosen=4), 1) == 4
    drafter.token_s = 0.020  # 20 ms a token: even one at 80 % does not pay for its wait
    assert drafter._paying(policy, Candidate([0] * 4, 0.8, chosen=4), 1) == 0
    drafter.token_s = 0.012  # in between: fewer, the likelier ones
    assert 0 < drafter._paying(policy, Candidate([0] * 4, 0.8, chosen=4), 1) < 4
