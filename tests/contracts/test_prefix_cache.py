"""Prefix block names and the head's summary: what the router and the stages agree on."""

from __future__ import annotations

import random

import pytest

from contracts.prefix_cache import PrefixSummary, block_hashes, chain_seed


def test_a_block_is_named_by_its_whole_prefix():
    seed = chain_seed("model", "pipeline", 1)
    a = block_hashes(list(range(40)), 16, seed)
    assert len(a) == 2  # the partial third block has no name
    b = block_hashes([99] + list(range(1, 40)), 16, seed)
    assert a[0] != b[0] and a[1] != b[1]  # one token early on changes every later name
    c = block_hashes(list(range(32)) + [7] * 16, 16, seed)
    assert c[:2] == a and len(c) == 3
    assert block_hashes(list(range(40)), 16, chain_seed("model", "pipeline", 2)) != a  # another epoch
    # Continued from the middle, the chain names the same blocks.
    assert block_hashes(list(range(48)), 16, seed, start=2, previous=a[1]) == block_hashes(
        list(range(48)), 16, seed)[2:]


def test_the_summary_finds_the_cached_prefix_and_never_the_last_token():
    seed = chain_seed("m", "p", 3)
    history = [random.Random(1).randrange(50_000) for _ in range(100)]
    names = block_hashes(history, 16, seed)
    summary = PrefixSummary.from_json(PrefixSummary.of(seed, 16, names, capacity_blocks=64).to_json())
    assert summary.cached_tokens(history + [5, 6, 7]) == 96  # six full blocks held
    assert summary.cached_tokens(history[:64]) == 48  # the last token is computed: block 4 is not reused
    assert summary.cached_tokens([1] + history[1:]) == 0


def test_the_false_positive_rate_is_what_the_size_promises():
    seed = chain_seed("m")
    rng = random.Random(7)
    held = [rng.getrandbits(64) for _ in range(4096)]
    summary = PrefixSummary.of(seed, 16, held, capacity_blocks=4096)
    assert all(name in summary for name in held)
    others = [rng.getrandbits(64) for _ in range(20_000)]
    rate = sum(name in summary for name in others) / len(others)
    assert rate < 0.035, rate
    assert len(summary.bits) == 4096  # 8 bits a block


@pytest.mark.parametrize("raw", [None, {}, {"seed": 1, "block_size": 0, "bloom": ""},
                                 {"seed": -1, "block_size": 16, "bloom": ""},
                                 {"seed": 1, "block_size": 16, "bloom": "not base64!"}])
def test_a_malformed_summary_is_refused_naming_it(raw):
    with pytest.raises(ValueError, match="malformed prefix summary"):
        PrefixSummary.from_json(raw)
