"""The stage a spec names, loaded as its process serves it, and its pacer: one card's
:class:`~worker_runtime.stage.Stage`, or rank 0 of a tensor-parallel group
(:class:`~worker_runtime.tensor_parallel.leader.LeadStage`) once its other ranks are started and loaded.
"""

from __future__ import annotations

import torch

from contracts.model_config import ModelConfig
from contracts.stage_spec import StageSpec

from .config import weight_cache_dir
from .pacing import Pacer
from .stage import DTYPES, Stage
from .tensor_parallel.leader import GroupLeader, LeadStage
from .tensor_parallel.pacing import ShardPacer, TimedGroup
from .tensor_parallel.shard import StageShard
from .tensor_parallel.shares import split_shares


def stage_dtype(spec: StageSpec) -> torch.dtype | None:
    """The spec's dtype; without one, fp32 on a CPU (an emulated card, or a stage the plan put on a host's
    CPU) and the checkpoint's elsewhere (None). A CPU's 16-bit matmuls are several times slower than its
    fp32 ones, and the CPU kernels (int8, int4, the fused decode step) are fp32: 16-bit weights stay 16-bit
    in memory and are widened in the matmul kernel's registers (docs/worker_runtime.md)."""
    if spec.dtype:
        return DTYPES[spec.dtype]
    return torch.float32 if torch.device(spec.device).type == "cpu" else None


def load_stage(spec: StageSpec, reuse: Stage | None = None) -> Stage | LeadStage:
    """The spec's stage; ``reuse``: the one-card stage this process served until a new spec came (its
    modules are taken over). A group's stage starts its other ranks and returns once all have loaded."""
    torch.set_num_threads(spec.threads)
    if spec.tensor_group:
        leader = GroupLeader(spec)
        shard = load_shard(spec, 0, leader.group)
        return LeadStage(shard, leader, leader.wait_loaded())
    return Stage.load(spec.model_path, *spec.layers, device=spec.device, dtype=stage_dtype(spec),
                      precision=spec.precision, kv_tokens=spec.kv_tokens, weight_cache=weight_cache_dir(),
                      reuse=reuse)


def load_shard(spec: StageSpec, rank: int, group) -> StageShard:
    """Rank ``rank``'s shard of the group stage in ``spec`` (every rank's share is in it), on its card at
    its bits; ``group``: its collectives, timed where the rank's card is emulated (its pacer leaves
    their time out)."""
    ranks = spec.tensor_group
    precisions = [spec.rank_spec(r).precision for r in range(len(ranks))]
    shares = split_shares(ModelConfig.from_file(spec.model_path), *spec.layers, [r.kv_heads for r in ranks],
                          [r.intermediate for r in ranks], precisions)
    mine = spec.rank_spec(rank)
    if mine.emulation is not None:
        group = TimedGroup(group)
    return StageShard.load(spec.model_path, *spec.layers, shares[rank], group, device=mine.device,
                           dtype=stage_dtype(mine), kv_tokens=spec.kv_tokens)


def stage_pacer(spec: StageSpec, stage: Stage | LeadStage) -> Pacer | ShardPacer | None:
    """The emulated card's pacing of this process's compute (a group's rank 0: its shard's, the group's
    collectives not counted); None on a real card."""
    if spec.emulation is None:
        return None
    return ShardPacer(stage.shard, spec.emulation) if spec.tensor_group else Pacer(stage, spec.emulation)
