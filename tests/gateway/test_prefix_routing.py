"""The pure router with prefix summaries: a cached prefix is not prefilled again, so a conversation
returns to the replica holding its history, and a prefix cached on one replica only draws requests
there until that replica's queue costs more than the reuse saves."""

from __future__ import annotations

import random
from unittest import mock

import pytest

from contracts.prefix_cache import PrefixSummary, block_hashes, chain_seed
from controlplane.gateway.routing import (
    Decision,
    PromptPrefix,
    ReplicaCosts,
    ReplicaState,
    RequestShape,
    Router,
)
from controlplane.gateway.routing import prefix as prefix_module

COSTS = ReplicaCosts(prefill_s_per_token=0.001, decode_s_per_token=0.002, decode_step_s=0.02)
BLOCK = 16


def summary_of(replica: str, *prompts: list[int], epoch: int = 1) -> PrefixSummary:
    """What a head whose pipeline is ``replica`` reports after serving ``prompts``."""
    seed = chain_seed("demo", replica, epoch)
    names = [name for p in prompts for name in block_hashes(p, BLOCK, seed)]
    return PrefixSummary.of(seed, BLOCK, names, 4096)


def shape(prompt: list[int], max_tokens: int = 20) -> RequestShape:
    return RequestShape(len(prompt), max_tokens, PromptPrefix(prompt))


def two(kv: int = 100_000) -> tuple[ReplicaState, ReplicaState]:
    return ReplicaState("r0", COSTS, kv), ReplicaState("r1", COSTS, kv)


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32_000) for _ in range(n)]


def test_the_estimates_are_lower_by_the_prefill_the_cached_prefix_saves():
    history = tokens(700, 1)
    request = shape(history + tokens(30, 2))
    cold, warm = two()
    warm.observe(prefix_summary=summary_of("r1", history))
    cached = warm.cached_tokens(request)
    assert cached == 700 // BLOCK * BLOCK  # whole blocks: the partial last one of the history is not
    saved = COSTS.prefill_s_per_token * cached
    assert warm.estimate_ttft(request) == pytest.approx(cold.estimate_ttft(request) - saved)
    assert warm.estimate_finish(request) == pytest.approx(cold.estimate_finish(request) - saved)
    # Queued behind it, only its uncached tokens count; its KV is reserved whole (the head reserves it).
    warm.start("a", request)
    cold.start("a", request)
    assert (warm.queued_tokens, cold.queued_tokens) == (730 - cached, 730)
    assert warm.kv_free == cold.kv_free


def test_the_router_counts_the_same_tokens_as_the_summary_and_names_a_prompt_once_per_chain():
    history = tokens(300, 3)
    summaries = [summary_of(f"r{i}", history[:n]) for i, n in enumerate((0, 100, 300))]
    for prompt in (history, history[:17], history[:16], history + [7], tokens(5, 4)):
        prefix = PromptPrefix(prompt)
        for summary in summaries:
            assert prefix.cached_tokens(summary) == summary.cached_tokens(prompt)
    prefix = PromptPrefix(history)
    with mock.patch.object(prefix_module, "block_hashes", wraps=block_hashes) as named:
        for _ in range(3):
            for summary in summaries:
                prefix.cached_tokens(summary)
    assert named.call_count == 3  # one chain per replica, however often asked


def test_the_cached_share_never_includes_the_last_prompt_token():
    prompt = tokens(32, 5)
    (r, _) = two()
    r.observe(prefix_summary=summary_of("r0", prompt))
    assert r.cached_tokens(shape(prompt)) == 16  # the head computes the last token itself
    assert r.cached_tokens(RequestShape(32, 5)) == 0  # a shape without its prompt expects nothing cached


def test_a_conversation_returns_to_the_replica_holding_its_history():
    system, first_turn = tokens(500, 6), tokens(200, 7)
    r0, r1 = two()
    r1.observe(prefix_summary=summary_of("r1", system + first_turn))
    r0.observe(prefix_summary=summary_of("r0", tokens(900, 8)))  # another conversation's
    second_turn = shape(system + first_turn + tokens(40, 9))
    decision = Router([r0, r1]).route(second_turn, deadline_s=60)
    assert isinstance(decision, Decision) and decision.replica is r1
    assert decision.cached_tokens == 688
    seen = {i.replica: i for i in decision.inputs}
    assert (seen["r0"].cached_tokens, seen["r1"].cached_tokens) == (0, 688)
    assert seen["r1"].estimated_finish_s < seen["r0"].estimated_finish_s
    # Without a summary the input says so (None), not that nothing matched (0).
    r0.observe(prefix_summary=None)
    inputs = Router([r0, r1]).route(second_turn, deadline_s=60).inputs
    assert {i.replica: i.cached_tokens for i in inputs} == {"r0": None, "r1": 688}


def test_a_prefix_cached_on_every_replica_weighs_the_same_everywhere():
    system = tokens(1000, 10)
    r0, r1 = two()
    r0.observe(prefix_summary=summary_of("r0", system))
    r1.observe(prefix_summary=summary_of("r1", system))
    router = Router([r0, r1])
    chosen = []
    for i in range(40):
        request = shape(system + tokens(20, 100 + i))
        decision = router.route(request, deadline_s=60)
        decision.replica.start(f"q{i}", request)
        chosen.append(decision.replica.replica_id)
    assert abs(chosen.count("r0") - chosen.count("r1")) <= 1  # load alone decides: they alternate


def test_a_prefix_cached_on_one_replica_draws_requests_until_its_queue_costs_more_than_the_reuse():
    """A hot system prompt held by r0 only: r0 takes the first requests (each saves 992 tokens of
    prefill there), but every request queued on r0 makes the next one wait for its uncached tail and
    shares its decode steps, so one goes to r1 once r0 is loaded enough; r1 holds the prompt from then
    on, and the concurrent requests spread instead of piling onto r0."""
    system = tokens(1000, 11)
    r0, r1 = two()
    r0.observe(prefix_summary=summary_of("r0", system))
    r1.observe(prefix_summary=summary_of("r1"))
    router = Router([r0, r1])
    chosen = []
    for i in range(60):
        request = shape(system + tokens(50, 200 + i), max_tokens=100)
        decision = router.route(request, deadline_s=600)
        decision.replica.start(f"q{i}", request)
        chosen.append(decision.replica.replica_id)
    first = chosen.index("r1")
    assert chosen[:first] == ["r0"] * first and first >= 3  # lightly loaded: the reuse wins
    assert chosen.count("r1") >= 25  # then both hold it, and the load decides


def test_a_prompt_sent_since_the_last_summary_counts_as_cached_until_the_next_one():
    """Heads are polled every REFRESH_S: a conversation's next turn may come sooner. A prompt sent to a
    replica counts as held there until a summary taken after its prefill says what the head kept."""
    history = tokens(400, 12)
    r0, r1 = two()
    for r in (r0, r1):
        r.observe(prefix_summary=summary_of(r.replica_id))
    router = Router([r0, r1])
    first = router.route(shape(history), deadline_s=60)
    first.replica.start("turn1", shape(history))
    assert first.cached_tokens == 0
    held, other = first.replica, r1 if first.replica is r0 else r0
    next_turn = shape(history + tokens(30, 13))
    assert held.cached_tokens(next_turn) == 384
    held.observe(prefix_summary=summary_of(held.replica_id))  # a summary taken before its prefill
    assert held.cached_tokens(next_turn) == 384
    held.token("turn1")
    held.finish("turn1")
    assert router.route(next_turn, deadline_s=60).replica is held  # both idle: its history is there
    assert other.cached_tokens(next_turn) == 0
    held.observe(prefix_summary=summary_of(held.replica_id))  # taken after: the head evicted it
    assert held.cached_tokens(next_turn) == 0
    held.observe(prefix_summary=None)  # caching turned off
    assert held.cached_tokens(next_turn) == 0


def test_a_re_formed_pipeline_forgets_the_prompts_sent_to_the_old_one():
    history = tokens(400, 14)
    (r, _) = two()
    r.observe(prefix_summary=summary_of("r0"))
    r.start("turn1", shape(history))  # still waiting for its prefill when the pipeline re-forms
    r.observe(prefix_summary=summary_of("r0", epoch=2))  # a new epoch: its caches start empty
    assert r.cached_tokens(shape(history + [1])) == 0


@pytest.mark.parametrize("strategy, expected", [("cost_aware", "r1"), ("cost_aware_prefix_blind", "r0")])
def test_the_prefix_blind_baseline_is_not_drawn_to_the_replica_holding_the_history(strategy, expected):
    """``cost_aware_prefix_blind`` is the cost router with nothing counted as cached (the baseline of
    ``benchmarks/prefix_bench.py route``): r1 holds the conversation but runs a short request, so only
    the reuse makes it the cheaper replica; the blind router's estimates are those of a cold prompt."""
    system, first_turn = tokens(500, 6), tokens(200, 7)
    r0, r1 = two()
    r1.observe(prefix_summary=summary_of("r1", system + first_turn))
    r0.observe(prefix_summary=summary_of("r0"))
    r1.start("other", shape(tokens(10, 12), max_tokens=5))
    second_turn = shape(system + first_turn + tokens(40, 9))
    decision = Router([r0, r1], strategy).route(second_turn, deadline_s=60)
    assert isinstance(decision, Decision) and decision.replica.replica_id == expected
    finish = {i.replica: i.estimated_finish_s for i in decision.inputs}
    cold = second_turn.prefix_blind()
    if strategy == "cost_aware_prefix_blind":
        assert finish == pytest.approx({"r0": r0.estimate_finish(cold), "r1": r1.estimate_finish(cold)})
    else:
        assert finish["r1"] < r1.estimate_finish(cold)
