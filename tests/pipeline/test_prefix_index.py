"""The head's prefix index with its ledger, without a model: which blocks a request reuses, what a step
names, and admission against the tightest stage, evicting cached blocks only when a request needs
the room (docs/pipeline.md, "Prefix caching")."""

from __future__ import annotations

from contracts.prefix_cache import block_hashes
from contracts.sampling import SamplingParams
from worker_runtime.kv_cache import KVCache
from worker_runtime.prefix_index import PrefixIndex
from worker_runtime.scheduler import KVLedger, Request, Scheduler

BLOCK = 4


def head(capacities=(64, 32)) -> tuple[Scheduler, PrefixIndex]:
    """A head whose stage 0 holds ``capacities[0]`` tokens and whose other stages hold the rest."""
    kv = KVCache(1, 1, 4, kv_tokens=capacities[0], block_size=BLOCK)
    ledger = KVLedger(kv)
    for stage, capacity in enumerate(capacities):
        ledger.set_stage(stage, capacity, BLOCK)
    index = PrefixIndex(kv, ledger, "model", "p0", epoch=1)
    return Scheduler(ledger, 1, 1000, 8, admission=index.admit), index


def request(rid: str, prompt: list[int], max_tokens: int = 2) -> Request:
    return Request(rid, b"c", prompt, SamplingParams(), max_tokens)


def run_to_end(scheduler: Scheduler, index: PrefixIndex, token: int = 7) -> None:
    """Run every admitted request to its end as the head does: stage 0's cache plans each step, the
    index names the blocks it fills, and an ended request is freed."""
    kv = index.kv
    while (mb := scheduler.next_micro_batch()) is not None:
        inputs = [r.next_input() for r in mb.requests]
        ops = index.operations(mb.requests, inputs)
        kv.plan([r.seq_id for r in mb.requests], [s for _, s in inputs], [len(t) for t, _ in inputs])
        index.commit([r.seq_id for r in mb.requests], ops)
        seq_ids = [r.seq_id for r in mb.requests]
        for r, _, reason in scheduler.on_tokens(mb.id, seq_ids, [token] * len(seq_ids)):
            if reason is not None:
                kv.free(r.seq_id)
                index.forget(r.seq_id)


def test_a_request_reuses_the_longest_cached_prefix_but_never_its_last_token():
    scheduler, index = head()
    system = list(range(1, 13))  # 3 blocks
    scheduler.submit(request("a", system + [50]))
    run_to_end(scheduler, index)
    assert index.kv.prefix_cached_blocks == 3  # 12 + 1 + 1 fed tokens: 3 full blocks named

    scheduler.submit(request("b", system + [60, 61]))
    b = scheduler.ready[0]
    assert b.cached == 12 and b.next_input() == ([60, 61], 12)
    ops = index.operations([b], [b.next_input()])
    assert ops.attach == [block_hashes(system, BLOCK, index.seed)] and ops.commit == [(3, [])]
    run_to_end(scheduler, index)

    scheduler.submit(request("c", system))  # the whole prompt cached: its last block is computed
    c = scheduler.ready[0]
    assert c.cached == 8 and c.next_input() == (system[8:], 8)
    assert index.kv.prefix_hit_tokens == 12 + 8


def test_the_tightest_stage_is_never_over_admitted_and_cached_blocks_go_only_for_room():
    scheduler, index = head(capacities=(64, 32))  # stage 1: 8 blocks
    first = list(range(1, 17))
    scheduler.submit(request("a", first, max_tokens=1))  # 17 tokens: 5 blocks
    run_to_end(scheduler, index)
    chain = block_hashes(first, BLOCK, index.seed)
    assert index.kv.names == chain and list(index.kv.evictable()) == chain[::-1]
    assert scheduler.ledger.free_tokens() == {0: 64, 1: 32}  # cached, unheld blocks count as free

    scheduler.submit(request("b", [90, 91, 92], max_tokens=13))  # 4 blocks: 4 of stage 1's are free
    assert len(scheduler.ready) == 1 and index.evicted == []  # fits without evicting
    scheduler.submit(request("c", first[:9], max_tokens=2))  # reuses 2 blocks, needs 1: stage 1 is full
    assert len(scheduler.ready) == 2 and index.evicted == [chain[3]]  # one block, the chain's tail
    assert index.kv.names == chain[:3]
    scheduler.submit(request("d", [80] * 6, max_tokens=2))  # 2 blocks, 1 evictable: waits, evicts nothing
    assert len(scheduler.waiting) == 1 and index.evicted == [chain[3]]
    assert scheduler.ledger.free_tokens()[1] == 4  # 8 blocks held or promised, chain[2] evictable
    run_to_end(scheduler, index)
    assert not scheduler.requests and not scheduler.waiting and index.kv.used_blocks <= 8


def test_a_request_waits_rather_than_evict_what_it_reuses_or_more_than_it_can_use():
    scheduler, index = head(capacities=(32, 32))  # 8 blocks
    scheduler.submit(request("a", list(range(1, 25)), max_tokens=1))  # 6 blocks named
    run_to_end(scheduler, index)
    scheduler.submit(request("long", [200] * 20, max_tokens=12))  # 8 blocks: 6 cached must go
    assert scheduler.ready and len(index.evicted) == 6 and index.kv.prefix_cached_blocks == 0
    scheduler.submit(request("waits", [201] * 3, max_tokens=2))
    assert len(scheduler.waiting) == 1 and len(index.evicted) == 6  # nothing more to evict: it waits


def test_caching_off_is_the_whole_length_admission():
    kv = KVCache(1, 1, 4, kv_tokens=64, block_size=BLOCK)
    ledger = KVLedger(kv)
    ledger.set_stage(0, 64, BLOCK)
    scheduler = Scheduler(ledger, 1, 1000, 8)
    scheduler.submit(request("a", list(range(1, 10)), max_tokens=3))
    assert scheduler.ready[0].cached == 0 and ledger.free_tokens() == {0: 64 - 12}


def test_while_a_failed_micro_batch_is_released_nothing_is_reused_and_then_unheld_blocks_go():
    scheduler, index = head()
    system = list(range(1, 13))
    scheduler.submit(request("a", system + [50]))
    run_to_end(scheduler, index)
    scheduler.submit(request("held", system + [51]))  # holds 3 cached blocks
    with index.distrusted():  # a stage may lack what stage 0 named
        scheduler.submit(request("meanwhile", system + [52]))
    held, meanwhile = scheduler.ready
    assert held.cached == 12 and meanwhile.cached == 0
    assert index.evicted == [] and index.kv.prefix_cached_blocks == 3  # held blocks stay
    scheduler.remove("held")
    index.kv.free(held.seq_id)
    with index.distrusted():
        pass
    assert len(index.evicted) == 3 and index.kv.prefix_cached_blocks == 0
