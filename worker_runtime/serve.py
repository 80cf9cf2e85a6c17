"""``python -m worker_runtime.serve --spec SPEC.json``: one stage process of a pipeline (contracts §1).

Loads the stage named by the spec, binds its endpoint, prints ``ready``, then serves: stage 0 as the
head (:mod:`worker_runtime.head`), the others as relays (:mod:`worker_runtime.relay`). SIGTERM drains
and exits 0; a fatal error prints an ``error`` event and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import uuid

import torch

from contracts.stage_spec import StageSpec

from .events import EventWriter
from .frames import FrameCodec
from .head import HeadLoop
from .pacing import Pacer
from .relay import RelayLoop
from .stage import DTYPES, Stage
from .stats import StageStats
from .transport import ZmqTransport
from .worker import StageWorker

log = logging.getLogger("worker_runtime.serve")


def load_stage(spec: StageSpec) -> Stage:
    torch.set_num_threads(spec.threads)
    start, end = spec.layers
    dtype = DTYPES[spec.dtype] if spec.dtype else None
    return Stage.load(spec.model_path, start, end, device=spec.device, dtype=dtype, bits=spec.bits,
                      low_bits=spec.low_bits, low_from=spec.low_from, kv_tokens=spec.kv_tokens)


def serve(spec: StageSpec, events: EventWriter, stop: threading.Event) -> None:
    """Load, bind, announce ``ready`` and serve until ``stop`` is set (then drain)."""
    stage = load_stage(spec)
    if stage.is_first != spec.is_head or stage.is_last != spec.is_last:
        raise ValueError(
            f"layers {list(spec.layers)} of a {stage.config.num_layers}-layer model do not fit stage "
            f"{spec.stage_index} of {spec.num_stages}"
        )
    worker = StageWorker(stage, StageStats(), Pacer(stage, spec.emulation) if spec.emulation else None)
    transport = ZmqTransport(
        FrameCodec(spec.pipeline_id, spec.auth_token),
        spec.listen,
        spec.next,
        None if spec.is_head else spec.head,
    )
    try:
        memory = stage.memory()
        events.emit(
            "ready",
            pipeline_id=spec.pipeline_id,
            stage_index=spec.stage_index,
            pid=os.getpid(),
            weight_bytes=memory.weight_bytes,
            kv_bytes=memory.kv_cache_bytes,
            kv_tokens=memory.kv_tokens,
        )
        if spec.is_head:
            HeadLoop(spec, worker, transport, events).run(stop.is_set)
        else:
            RelayLoop(spec, worker, transport, events, uuid.uuid4().hex).run(stop.is_set)
    finally:
        transport.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="stage spec JSON file (docs/contracts.md §1)")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    events = EventWriter()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        spec = StageSpec.from_file(args.spec)
        serve(spec, events, stop)
    except Exception as exc:  # the agent must learn why: print it as an event, then crash
        log.exception("stage failed")
        events.emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
