"""KV accounting: the budget is enforced before anything is written, freeing returns space, and
ragged batches give exactly the tokens each sequence gets alone."""

from __future__ import annotations

import os

import pytest
import torch

from worker_runtime import Batch, KVBudgetExceeded, KVCache, Stage, generate, run_stages


@pytest.fixture
def model_path(checkpoints):
    return checkpoints["llama_gqa_llama3"]


def two_stages(path, kv_tokens=256, block_size=16):
    return [Stage.load(path, 0, 2, kv_tokens=kv_tokens, block_size=block_size),
            Stage.load(path, 2, 4, kv_tokens=kv_tokens, block_size=block_size)]


def test_allocate_refuses_past_the_budget_and_reserves_nothing():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=16)
    cache.allocate(1, 40)  # 3 blocks
    assert cache.free_tokens == 16
    with pytest.raises(KVBudgetExceeded, match="16 of 64 are free"):
        cache.allocate(2, 17)
    with pytest.raises(KVBudgetExceeded, match="whole cache holds 64"):
        cache.allocate(3, 65)
    assert cache.free_tokens == 16 and cache.sequences == [1]
    cache.free(1)
    assert cache.free_tokens == 64 and cache.sequences == []
    cache.allocate(2, 64)  # the freed space is usable again
    assert cache.free_tokens == 0


def test_clear_forgets_every_sequence():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=16)
    cache.allocate(1, 20)
    cache.allocate(2, 30)
    cache.clear()
    assert cache.free_tokens == 64 and cache.sequences == [] and cache.length(1) == 0


def test_forward_past_the_budget_raises_before_touching_the_cache(model_path):
    stage = Stage.load(model_path, 0, 4, kv_tokens=32, block_size=8)
    stage.forward(Batch.of_tokens([1], [list(range(3, 23))], [0]))  # 20 tokens -> 3 blocks
    k_before, free_before = stage.kv.k.clone(), stage.kv.free_tokens
    batch = Batch.of_tokens([1, 2], [[5], list(range(3, 13))], [20, 0])  # needs 0 + 2 blocks, 1 free
    with pytest.raises(KVBudgetExceeded):
        stage.forward(batch)
    assert torch.equal(stage.kv.k, k_before) and stage.kv.free_tokens == free_before
    assert stage.kv.length(1) == 20 and stage.kv.length(2) == 0
    stage.kv.free(1)
    stage.forward(batch.__class__.of_tokens([2], [list(range(3, 13))], [0]))
    assert stage.kv.length(2) == 10


def test_generate_refuses_a_sequence_longer_than_the_budget_with_a_clear_error(model_path):
    stages = two_stages(model_path, kv_tokens=32, block_size=8)
    with pytest.raises(KVBudgetExceeded, match="KV"):
        generate(stages, [list(range(3, 23))], max_new_tokens=20)
    assert all(s.kv.free_tokens == s.kv.capacity_tokens for s in stages)  # freed on the way out


PROMPTS = [list(range(3, 6)), list(range(40, 57)), [9], list(range(100, 130)), list(range(7, 16))]


def test_mixed_length_batch_gives_the_same_tokens_as_each_sequence_alone(model_path):
    stages = two_stages(model_path, block_size=4)
    alone = [generate(stages, [p], max_new_tokens=12)[0] for p in PROMPTS]
    together = generate(stages, PROMPTS, max_new_tokens=12, seq_ids=[11, 3, 42, 7, 0])
    assert together == alone
    assert all(s.kv.free_tokens == s.kv.capacity_tokens for s in stages)


def test_prefill_and_decode_share_a_batch(model_path):
    """A sequence decoding while another prefills gets the logits it gets alone."""
    stages = two_stages(model_path, block_size=4)
    a, b = PROMPTS[1], PROMPTS[3]
    run_stages(stages, Batch.of_tokens([1], [a], [0]))
    solo_a = run_stages(stages, Batch.of_tokens([1], [[77]], [len(a)]))
    solo_b = run_stages(stages, Batch.of_tokens([2], [b], [0]))
    for s in stages:
        s.kv.free(1), s.kv.free(2)
    run_stages(stages, Batch.of_tokens([1], [a], [0]))
    mixed = run_stages(stages, Batch.of_tokens([2, 1], [b, [77]], [0, len(a)]))
    torch.testing.assert_close(mixed[1], solo_a[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[0], solo_b[0], atol=1e-5, rtol=0)


def test_chunked_prefill_and_retried_step_match_one_shot_prefill(model_path):
    stages = two_stages(model_path, block_size=4)
    prompt = PROMPTS[3]
    whole = run_stages(stages, Batch.of_tokens([1], [prompt], [0]))
    run_stages(stages, Batch.of_tokens([2], [prompt[:13]], [0]))
    run_stages(stages, Batch.of_tokens([2], [prompt[13:]], [13]))
    retried = run_stages(stages, Batch.of_tokens([2], [prompt[13:]], [13]))  # same step again
    torch.testing.assert_close(retried, whole, atol=1e-5, rtol=0)
    assert stages[0].kv.length(2) == len(prompt)
    with pytest.raises(ValueError, match="start position 40"):
        run_stages(stages, Batch.of_tokens([2], [[1]], [40]))


def test_freed_blocks_are_reused_by_other_sequences_without_leaking_old_state(model_path):
    stages = two_stages(model_path, kv_tokens=48, block_size=4)
    first = generate(stages, [PROMPTS[3]], max_new_tokens=8)  # fills most of the cache
    again = generate(stages, [PROMPTS[3]], max_new_tokens=8)
    short = generate(stages, [PROMPTS[0]], max_new_tokens=8)
    fresh = two_stages(model_path, kv_tokens=48, block_size=4)
    assert first == again and short == generate(fresh, [PROMPTS[0]], max_new_tokens=8)


def test_memory_report_counts_the_cache(model_path):
    stage = Stage.load(model_path, 0, 4, kv_tokens=100, block_size=16)
    report = stage.memory()
    # 4 layers x K and V x 112 slots (7 blocks) x 2 kv heads x 16 dims x 4 bytes
    assert report.kv_tokens == 112 and report.kv_cache_bytes == 4 * 2 * 112 * 2 * 16 * 4
    assert report.kv_bytes_per_token == 4 * 2 * 2 * 16 * 4


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_large_cpu_pool_commits_memory_only_as_it_is_used_and_reads_zero_where_unwritten():
    """A stage's pool at a plan's budget is about a GB: allocating it must not write every page (that
    was most of a replacement stage's load), yet unused slots must read as zeros (padded gathers)."""
    before = _rss_bytes()
    cache = KVCache(8, 4, 64, 131072)  # 2 x 1 GiB of fp32
    assert _rss_bytes() - before < 64 * 2**20
    assert cache.k.shape == (8, 131072, 4, 64) and cache.k.dtype == torch.float32
    cache.k[3, 1000] = 1.5
    cache.v[7, 131071] = -2.0
    assert cache.k[3, 1000].eq(1.5).all() and cache.v[7, 131071].eq(-2.0).all()
    assert cache.k[3, 999].abs().sum() == 0 and cache.v[0, :4096].abs().sum() == 0
    assert _rss_bytes() - before < 64 * 2**20


# ----- prefix caching: named blocks shared by reference, kept until the head evicts them

A, B, C = 0xA, 0xB, 0xC


def filled(cache: KVCache, seq_id: int, tokens: int) -> None:
    """``seq_id`` holding ``tokens`` tokens, as a step of that many would leave it (no model needed)."""
    cache.plan([seq_id], [cache.length(seq_id)], [tokens - cache.length(seq_id)])


def test_named_blocks_are_shared_by_reference_and_cached_once_unheld():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)  # 16 blocks
    filled(cache, 1, 10)  # 2 full blocks and a partial one
    cache.commit(1, 0, [A, B])
    cache.attach(2, [A, B])
    assert cache.length(2) == 8 and cache.prefix_hit_tokens == 8 and cache.prefix_cached_blocks == 2
    filled(cache, 2, 11)  # its own copy of the partial tail: a shared block is never written
    assert cache.used_blocks == 4 and cache.prefix_queried_tokens == 10 + 11
    cache.free(1)  # its private partial block returns, the shared ones stay held by 2
    assert cache.used_blocks == 3 and cache.evictable_blocks == 0 and cache.evict([A, B]) == 0
    cache.free(2)
    assert cache.used_blocks == 2 and list(cache.evictable()) == [B, A]  # a chain goes from its end
    assert cache.free_tokens == 56 and cache.holds(A) and cache.holds(B)


def test_lru_order_follows_the_last_release_and_attaching_takes_a_block_out_of_it():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)
    filled(cache, 1, 4)
    cache.commit(1, 0, [A])
    filled(cache, 2, 4)
    cache.commit(2, 0, [B])
    cache.free(1), cache.free(2)
    assert list(cache.evictable()) == [A, B]
    cache.attach(3, [A])
    assert list(cache.evictable()) == [B]
    cache.free(3)
    assert list(cache.evictable()) == [B, A]  # A was used last
    assert cache.evict([B, C]) == 1 and cache.prefix_evicted_blocks == 1  # C is not cached: skipped
    assert not cache.holds(B) and cache.free_tokens == 60 and cache.names == [A]


def test_attach_of_an_unknown_name_or_an_existing_sequence_raises_and_changes_nothing():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)
    filled(cache, 1, 8)
    cache.commit(1, 0, [A, B])
    with pytest.raises(ValueError, match="not cached on this stage"):
        cache.attach(2, [A, C])
    with pytest.raises(ValueError, match="only a new sequence"):
        cache.attach(1, [A])
    assert cache.length(2) == 0 and cache.sequences == [1] and cache.prefix_hit_tokens == 0
    cache.free(1)
    assert cache.evictable_blocks == 2  # no reference was left behind by the failed attach


def test_commit_names_only_full_unnamed_blocks_and_a_name_held_elsewhere_stays_private():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)
    filled(cache, 1, 6)
    with pytest.raises(ValueError, match="not all full"):
        cache.commit(1, 0, [A, B])  # block 1 holds 2 of 4 tokens: a partial block has no name
    cache.commit(1, 0, [A])
    with pytest.raises(ValueError, match="already has a name"):
        cache.commit(1, 0, [A])
    filled(cache, 2, 4)  # the same prefix computed again by a sequence that did not attach it
    cache.commit(2, 0, [A])  # A names sequence 1's block: this one stays private
    assert cache.prefix_cached_blocks == 1
    cache.free(2)
    assert cache.used_blocks == 2  # its block went back to the free list, not to the cached ones


def test_a_step_may_not_rewrite_a_shared_block():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)
    filled(cache, 1, 8)
    cache.commit(1, 0, [A])
    with pytest.raises(ValueError, match="overwrite a shared block"):
        cache.plan([1], [2], [1])
    cache.plan([1], [5], [1])  # the private tail may be recomputed


def test_clear_forgets_names_too():
    cache = KVCache(2, 2, 8, kv_tokens=64, block_size=4)
    filled(cache, 1, 8)
    cache.commit(1, 0, [A, B])
    version = cache.names_version
    cache.clear()
    assert cache.free_tokens == 64 and cache.names == [] and not cache.holds(A)
    assert cache.names_version != version and list(cache.evictable()) == []


def test_a_sequence_attaching_a_cached_prefix_gets_the_logits_of_a_whole_prefill(model_path):
    stages = two_stages(model_path, block_size=4)
    prompt = PROMPTS[3]  # 30 tokens: 7 full blocks
    whole = run_stages(stages, Batch.of_tokens([1], [prompt], [0]))
    names = list(range(100, 107))
    for stage in stages:
        stage.kv.commit(1, 0, names)
        stage.kv.free(1)
        stage.kv.attach(2, names[:5])  # 20 tokens reused, 10 computed
    reused = run_stages(stages, Batch.of_tokens([2], [prompt[20:]], [20]))
    torch.testing.assert_close(reused, whole, atol=1e-5, rtol=0)
    assert all(s.kv.prefix_queried_tokens == 60 and s.kv.prefix_hit_tokens == 20 for s in stages)
