"""Pacing a tensor-parallel rank (worker_runtime/tensor_parallel/pacing.py): a share's modeled time is its
part of the stage's, and the step's collectives are not paced as compute but added on top."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

from contracts.model_config import ModelConfig
from contracts.stage_spec import Emulation
from worker_runtime import Batch, Stage
from worker_runtime.pacing import Pacer
from worker_runtime.tensor_parallel import StageShard, split_shares
from worker_runtime.tensor_parallel.pacing import ShardPacer, TimedGroup

MODEL = ModelConfig.from_dict(dict(
    model_type="llama", hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=4,
    num_hidden_layers=4, vocab_size=256, torch_dtype="float32"))
CARD = Emulation(memory_bandwidth_gbs=300.0, fp16_tflops=60.0)
COLLECTIVE_S = 0.004


class SlowLink:
    """A group of one rank whose collectives take ``COLLECTIVE_S`` each (a slow link)."""

    rank, size = 0, 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(COLLECTIVE_S)
        return x

    broadcast = all_reduce


def shards(group=None) -> list[StageShard]:
    shares = split_shares(MODEL, 1, 3, [3, 1], [192, 64])
    return [StageShard(MODEL, 1, 3, share, group or TimedGroup(SlowLink()), kv_tokens=64, block_size=8)
            for share in shares]


def decode(context: int = 20) -> Batch:
    return Batch([1], [context], [1], hidden=torch.randn(1, MODEL.hidden_size))


def prefill(tokens: int = 8) -> Batch:
    return Batch([1], [0], [tokens], hidden=torch.randn(tokens, MODEL.hidden_size))


def test_the_shares_model_their_parts_of_the_stage():
    whole = Pacer(Stage(MODEL, 1, 3, kv_tokens=64, block_size=8), CARD)
    parts = [ShardPacer(shard, CARD).pacer for shard in shards()]
    assert sum(p.params_per_token for p in parts) == whole.params_per_token
    assert sum(p.kv_bytes_per_token for p in parts) == whole.kv_bytes_per_token
    norms = 2 * 2 * MODEL.hidden_size * 2  # two norms a layer, two layers, 16-bit: every rank holds them
    assert sum(p.weight_bytes for p in parts) == whole.weight_bytes + norms
    assert parts[0].modeled_s(decode()) > 2.5 * parts[1].modeled_s(decode())  # 3/4 of the stage vs 1/4


def test_a_rank_paces_its_compute_and_adds_the_collectives():
    shard = shards()[1]
    shard.forward(prefill())  # warm, sequence 1
    batch = replace(prefill(), seq_ids=[2])
    modeled = 0.2
    scale = modeled / ShardPacer(shard, CARD).modeled_s(batch)
    pacer = ShardPacer(shard, Emulation(CARD.memory_bandwidth_gbs, CARD.fp16_tflops, time_scale=scale))
    count, seconds = shard.group.count, shard.group.seconds
    started = time.perf_counter()
    shard.forward(batch)
    elapsed = time.perf_counter() - started
    slept = pacer.pace(batch, elapsed)
    total = time.perf_counter() - started
    collectives = shard.group.seconds - seconds
    assert shard.group.count - count == 1 + 2 * 2  # the broadcast, two all-reduces a layer
    assert collectives >= 5 * COLLECTIVE_S
    compute = elapsed - collectives
    assert slept == pytest.approx(max(0.0, modeled - compute), abs=1e-3)
    # The sleep it asked for happened (a loaded host's sleeps overrun, never fall short).
    assert max(modeled, compute) + collectives - 0.005 <= total < max(modeled, compute) + collectives + 0.1
    assert pacer.pace(batch, 0.0) == pytest.approx(modeled, abs=1e-3)  # no collective since: all compute


def test_a_shard_pacer_needs_the_collectives_timed():
    with pytest.raises(TypeError, match="TimedGroup"):
        ShardPacer(shards(group=SlowLink())[0], CARD)
