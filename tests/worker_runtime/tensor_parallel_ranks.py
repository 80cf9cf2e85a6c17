"""The processes of the tensor-parallel tests: each one a rank of the groups the tests form, one after
another, through the default process group (gloo, a file rendezvous per group)."""

from __future__ import annotations

import traceback
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from worker_runtime.stage import Batch
from worker_runtime.tensor_parallel import StageShard, init_group


def serve(rank: int, jobs, results) -> None:
    """Run the groups sent on ``jobs`` as ``rank`` until None arrives; put (rank, outcome, error) on
    ``results``."""
    torch.set_num_threads(1)
    for job in iter(jobs.get, None):
        try:
            results.put((rank, run_shard(rank, **job), None))
        except Exception:  # the test process reports it
            results.put((rank, None, traceback.format_exc()))


def run_shard(rank: int, size: int, init_method: str, path: str, start: int, end: int, shares: list,
              steps: list[tuple[Batch, bool]]) -> dict:
    """Load ``shares[rank]`` of layers [start, end) and run ``steps``; rank 0's outputs (numpy) and what the
    rank holds. Ranks other than 0 get the batches without their tensors."""
    group = init_group(rank, size, init_method, "cpu", timeout=timedelta(seconds=60))
    try:
        shard = StageShard.load(path, start, end, shares[rank], group, kv_tokens=64, block_size=8)
        outputs = []
        for batch, all_logits in steps:
            mine = batch if rank == 0 else replace(batch, input_ids=None, hidden=None)
            out = shard.forward(mine, all_logits)
            outputs.append(None if out is None else np.array(out))
        holds = {"kv_heads": shard.kv.k.shape[2], "embed": shard.embed is not None,
                 "lm_head": shard.lm_head is not None}
        return {"outputs": outputs, "holds": holds}
    finally:
        dist.destroy_process_group()
