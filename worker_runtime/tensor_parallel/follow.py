"""``python -m worker_runtime.tensor_parallel.follow --rank R --port P`` (its stage spec on stdin): rank R
of a served tensor-parallel stage, started by rank 0 (leader.py) on the same node.

It joins the group through rank 0's store on port P, loads its shard (its card, its share, its bits),
reports its memory, then does what rank 0 tells it on the control channel until told to stop: a forward
over the batch rank 0 runs (its part of every layer, its kv heads' cache) and each change rank 0 makes to
its own cache. It keeps no request state and opens no socket of its own. When rank 0 dies its next
collective fails, and so does this process.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

from contracts.stage_spec import StageSpec

from ..kv_cache import KVBudgetExceeded
from ..spec_stage import load_shard
from ..stage import Batch
from .channel import ControlChannel
from .leader import MIRRORED
from .pacing import ShardPacer
from .rendezvous import join, join_store, report_loaded
from .shard import StageShard

log = logging.getLogger("worker_runtime.tensor_parallel.follow")


def follow(shard: StageShard, channel: ControlChannel, pacer: ShardPacer | None) -> None:
    """Do what rank 0 says until it says stop (see the module doc)."""
    while (message := channel.receive())["op"] != "stop":
        if message["op"] == "forward":
            batch = Batch(message["seq_ids"], message["starts"], message["lengths"],
                          logit_rows=message["logit_rows"])
            started = time.perf_counter()
            try:
                shard.forward(batch)
            except KVBudgetExceeded:
                continue  # rank 0's cache refused the same batch, before any collective
            if pacer is not None:
                pacer.pace(batch, time.perf_counter() - started)
        elif message["op"] == "kv" and message["method"] in MIRRORED:
            try:
                getattr(shard.kv, message["method"])(*message["args"])
            except (KVBudgetExceeded, KeyError, ValueError):
                pass  # rank 0's cache raised the same, having changed nothing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True, help="rank 0's store")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s %(name)s[rank {args.rank}] %(levelname)s %(message)s")
    spec = StageSpec.from_dict(json.loads(sys.stdin.read()))
    mine = spec.rank_spec(args.rank)
    store = join_store(args.port, len(spec.tensor_group))
    group, channel = join(args.rank, len(spec.tensor_group), store, mine.device)
    torch.set_num_threads(mine.threads)
    shard = load_shard(spec, args.rank, group)
    report_loaded(store, args.rank, shard.memory())
    log.info("rank %d of stage %d of %s: layers %s loaded", args.rank, spec.stage_index, spec.pipeline_id,
             list(spec.layers))
    follow(shard, channel, ShardPacer(shard, mine.emulation) if mine.emulation is not None else None)
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except Exception:  # rank 0's stderr carries it: the agent shows its tail
        log.exception("tensor-parallel rank failed")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    import os

    os._exit(code)
