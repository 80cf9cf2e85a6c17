"""The host tier's store: named KV blocks copied out of a device cache and back bit for bit, least
recently used dropped first within its budget, lazily committed on the CPU, pinned for a CUDA stage."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from worker_runtime.host_tier import HostTier
from worker_runtime.kv_cache import KVCache
from worker_runtime.protocol import host_ops_of
from worker_runtime.worker import StageWorker

LAYERS, HEADS, HEAD_DIM, BLOCK = 3, 2, 8, 4


def cache(device: str = "cpu") -> KVCache:
    kv = KVCache(LAYERS, HEADS, HEAD_DIM, 8 * BLOCK, block_size=BLOCK, device=device)
    kv.k.copy_(torch.randn_like(kv.k))
    kv.v.copy_(torch.randn_like(kv.v))
    return kv


def block(kv: KVCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of one device block's K and V: ``[layers, block_size, kv_heads, head_dim]``."""
    slots = slice(index * BLOCK, (index + 1) * BLOCK)
    return kv.k[:, slots], kv.v[:, slots]


def tier(blocks: int, device: str = "cpu") -> HostTier:
    return HostTier(LAYERS, HEADS, HEAD_DIM, blocks * BLOCK + BLOCK - 1, block_size=BLOCK, device=device,
                    dtype=torch.float32)


def test_a_block_comes_back_bit_for_bit_into_another_device_block_and_stays_in_the_tier():
    kv, host = cache(), tier(2)
    assert host.num_blocks == 2  # whole blocks of the budget only
    k, v = (t.clone() for t in block(kv, 1))
    assert host.offload(0xAB, *block(kv, 1)) is None
    kv.k.zero_()
    kv.v.zero_()
    assert 0xAB in host and len(host) == 1
    host.restore(0xAB, *block(kv, 5))
    assert torch.equal(block(kv, 5)[0], k) and torch.equal(block(kv, 5)[1], v)
    assert 0xAB in host and len(host) == 1
    assert block(kv, 4)[0].abs().sum() == 0 and block(kv, 6)[1].abs().sum() == 0  # neighbours untouched
    with pytest.raises(KeyError):
        host.restore(0xCD, *block(kv, 5))


def test_the_least_recently_used_block_makes_room_and_is_named():
    kv, host = cache(), tier(2)
    assert host.offload(1, *block(kv, 0)) is None
    assert host.offload(2, *block(kv, 1)) is None
    assert host.offload(1, *block(kv, 0)) is None  # held already: now the most recent, nothing copied
    assert host.offload(3, *block(kv, 2)) == 2
    assert (1 in host, 2 in host, 3 in host) == (True, False, True)
    host.restore(1, *block(kv, 7))  # a restore is a use: 3 is now the least recent
    assert torch.equal(block(kv, 7)[0], block(kv, 0)[0])
    assert host.offload(4, *block(kv, 3)) == 3
    host.restore(4, *block(kv, 6))
    assert torch.equal(block(kv, 6)[1], block(kv, 3)[1])


def test_drop_and_clear_forget_and_free_the_room():
    kv, host = cache(), tier(2)
    host.offload(1, *block(kv, 0))
    host.offload(2, *block(kv, 1))
    assert host.drop(1) and not host.drop(1) and len(host) == 1
    assert host.offload(3, *block(kv, 2)) is None
    host.clear()
    assert len(host) == 0 and 2 not in host and 3 not in host
    assert [host.offload(n, *block(kv, n)) for n in (4, 5)] == [None, None]


def test_a_budget_below_one_block_holds_nothing():
    host = HostTier(LAYERS, HEADS, HEAD_DIM, BLOCK - 1, block_size=BLOCK, device="cpu", dtype=torch.float32)
    assert host.num_blocks == 0 and len(host) == 0
    with pytest.raises(ValueError, match="no host tier"):
        host.offload(1, *block(cache(), 0))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_large_cpu_tier_commits_memory_only_as_blocks_arrive():
    before = _rss_bytes()
    host = HostTier(8, 4, 64, 131072, block_size=16, device="cpu", dtype=torch.float32)  # 2 x 1 GiB
    assert host.k.shape == (8192, 8, 16, 4, 64)
    assert _rss_bytes() - before < 64 * 2**20
    host.offload(7, torch.ones(8, 16, 4, 64), torch.ones(8, 16, 4, 64))
    assert _rss_bytes() - before < 64 * 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_stage_copies_through_pinned_memory():
    kv, host = cache("cuda:0"), tier(2, "cuda:0")
    assert host.k.is_pinned() and host.v.is_pinned()
    k = block(kv, 1)[0].clone()
    host.offload(9, *block(kv, 1))
    host.restore(9, *block(kv, 6))
    torch.cuda.synchronize()
    assert torch.equal(block(kv, 6)[0], k)


def test_the_device_cache_moves_a_named_block_out_and_back_and_clears_the_tier_with_itself():
    kv = cache()
    kv.host = tier(2)
    kv.plan([1], [0], [BLOCK])  # one full block of sequence 1: the fresh cache's block 0
    kv.commit(1, 0, [77])
    k = block(kv, 0)[0].clone()
    assert not kv.offload(77)  # held by a sequence: not evictable
    kv.free(1)
    assert kv.offload(77) and not kv.holds(77) and 77 in kv.host
    kv.k.zero_()
    assert kv.restore(77) and kv.holds(77) and not kv.restore(77)  # cached again: nothing to do
    assert torch.equal(block(kv, 0)[0], k)  # into the block the eviction freed
    kv.attach(2, [77])
    assert kv.length(2) == BLOCK
    assert not kv.restore(78)  # not in the tier
    kv.clear()
    assert len(kv.host) == 0


def test_a_free_frames_host_operations_are_checked():
    assert host_ops_of([["offload", 5], ["drop", 6], ["restore", 5], ["clear", 0]]) == [
        ("offload", 5), ("drop", 6), ("restore", 5), ("clear", 0)]
    for bad in ([["evict", 1]], [["offload", -1]], [["offload"]], {"offload": 1}):
        with pytest.raises((TypeError, ValueError)):
            host_ops_of(bad)


def test_a_relay_without_room_skips_the_copy_back_instead_of_failing(caplog):
    """A relay that no longer matches the head (a failed micro-batch) may lack a free block: the copy is
    skipped and logged, the frame's other operations still done."""
    kv = cache()
    kv.host = tier(2)
    kv.plan([1], [0], [BLOCK])
    kv.commit(1, 0, [77])
    kv.free(1)
    kv.offload(77)
    kv.allocate(2, kv.capacity_tokens)  # every block taken
    worker = StageWorker(SimpleNamespace(kv=kv), stats=None)
    worker.replay_host([("restore", 77), ("drop", 77)])
    assert not kv.holds(77) and 77 not in kv.host and "not copied back" in caplog.text
