"""Tensor parallelism inside a pipeline stage: a group of processes, one per card, each holding an uneven
share of every layer of the stage and reducing the partial results through ``torch.distributed``.

- ``shares.py``: :class:`Share`, which heads and MLP columns a rank holds at which precision, and
  :func:`split_shares`, the validated split of a stage among a group;
- ``group.py``: :class:`ShardGroup`, the group's collectives (gloo on CPU, NCCL on CUDA);
- ``shard.py``: :class:`StageShard`, one rank's shard of a stage: its slices, its KV cache, the forward;
- ``pacing.py``: ``ShardPacer`` and ``TimedGroup``, an emulated rank's compute paced, its collectives not;
- serving a group stage: ``rendezvous.py`` (forming the group), ``channel.py`` (rank 0's control messages),
  ``leader.py`` (rank 0, the stage its pipeline sees), ``follow.py`` (every other rank's process).

docs/pipeline.md, "Tensor-parallel stages".
"""

from .group import ShardGroup, backend_for, init_group
from .shard import StageShard
from .shares import Share, split_shares

__all__ = ["Share", "ShardGroup", "StageShard", "backend_for", "init_group", "split_shares"]
