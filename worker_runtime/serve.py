"""``python -m worker_runtime.serve --spec SPEC.json``: one stage process of a pipeline (contracts §1).

Loads the stage named by the spec, binds its endpoint, prints ``ready``, then serves: stage 0 as the
head (:mod:`worker_runtime.head`), the others as relays (:mod:`worker_runtime.relay`). SIGTERM drains
and exits 0; SIGUSR1 (the stage is being replaced by a new spec) stops at once and exits 0; a fatal
error prints an ``error`` event and exits 1. A spec path written on stdin is a new spec taken in place
(spec_inbox.py): the stage leaves its pipeline as a replaced one does, then serves the new spec.

Most stages do not start through this command line but are forked from the agent's fork server
(worker_runtime/fork_server.py), which has imported everything once and calls ``main`` with the same
arguments (docs/agents.md, "The stage fork server").
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import signal
import sys
import threading
import time
import uuid

import torch

from contracts.model_config import ModelConfig
from contracts.precision import Precision
from contracts.stage_spec import SpecError, StageSpec, respec_blocker, spec_digest, spec_file_read
from contracts.tracing import tracing_setup, tracing_shutdown

from .events import EventWriter
from .frames import FrameCodec
from .head import HeadLoop
from .host_tier import HostTier
from .kv_cache import KVCache
from .relay import RelayLoop
from .spec_inbox import SpecInbox
from .spec_stage import load_stage, stage_pacer
from .stage import Batch, Stage
from .stats import StageStats
from .structured import Grammars
from .tensor_parallel.leader import LeadStage
from .transport import ZmqTransport
from .worker import StageWorker

log = logging.getLogger("worker_runtime.serve")


def serve(raw: dict, events: EventWriter, stop: threading.Event, replaced: threading.Event,
          inbox: SpecInbox) -> None:
    """Load, bind, announce ``ready`` and serve the spec ``raw`` until ``stop`` is set (then drain, unless
    ``replaced``); a new spec in ``inbox`` is taken in place (spec_inbox.py) and served the same way."""
    stage: Stage | LeadStage | None = None
    loaded: dict = raw
    transport: ZmqTransport | None = None
    warmed: str | None = None  # the pipeline this process headed through a warm-up: in place, no second one
    try:
        while True:
            spec, began = StageSpec.from_dict(raw), time.monotonic()
            tracing_setup("stage", pipeline=(spec.pipeline_id, spec.auth_token), node=platform.node(),
                          device=spec.device, stage=f"{spec.pipeline_id}/{spec.stage_index}")
            stage = _stage_for(spec, stage, loaded)
            loaded = raw
            if stage.is_first != spec.is_head or stage.is_last != spec.is_last:
                raise ValueError(
                    f"layers {list(spec.layers)} of a {stage.config.num_layers}-layer model do not fit stage "
                    f"{spec.stage_index} of {spec.num_stages}"
                )
            stage.kv.host = _host_tier(spec, stage.kv)
            pacer = stage_pacer(spec, stage)
            grammars = None
            if spec.is_last:  # the sampler's, over the checkpoint's whole vocabulary (a TP share's too)
                grammars = Grammars(spec.model_path, ModelConfig.from_file(spec.model_path).vocab_size)
            worker = StageWorker(stage, StageStats(), pacer, grammars)
            head = None if spec.is_head else spec.head
            if transport is None:
                codec = FrameCodec(spec.pipeline_id, spec.auth_token)
                transport = ZmqTransport(codec, spec.listen, spec.next, head)
            else:
                transport.relink(spec.next, head)
            _announce(spec, stage, events, raw, began)
            if spec.hold and not inbox.wait(stop):  # started beside, joins when its spec comes (contracts §1)
                return
            stopping, leaving = (lambda: stop.is_set() or inbox.pending()), (
                lambda: replaced.is_set() or inbox.pending())
            if spec.is_head:
                head_loop = HeadLoop(spec, worker, transport, events, warmed=warmed == spec.pipeline_id)
                head_loop.run(stopping, leaving)
                warmed = None if head_loop.membership.warm_up_due else spec.pipeline_id
            else:
                RelayLoop(spec, worker, transport, events, uuid.uuid4().hex).run(stopping, leaving)
            path = inbox.take()
            if path is None or stop.is_set():
                return
            raw = _respec(raw, path)
    finally:
        if transport is not None:
            transport.close()
        if stage is not None:
            stage.close()


def _stage_for(spec: StageSpec, running: Stage | LeadStage | None, running_raw: dict) -> Stage | LeadStage:
    """The stage to serve ``spec`` with: the running one as it is when the new spec changes nothing it
    loaded (its neighbours moved, or it was held), its sequences dropped (they end with the old spec);
    else loaded, taking over what the running one holds."""
    if (running is not None and tuple(running_raw["layers"]) == spec.layers
            and Precision.of(running_raw) == spec.precision
            and running_raw.get("kv_tokens") == spec.kv_tokens):
        running.kv.clear()
        return running
    return load_stage(spec, reuse=running)


def _host_tier(spec: StageSpec, kv: KVCache) -> HostTier | None:
    """The spec's host KV tier for the stage's cache ``kv``: none below one block; the one ``kv`` has when
    its size is unchanged (pinned memory is slow to allocate), else a new one."""
    blocks = spec.host_kv_tokens // kv.block_size
    if not blocks:
        return None
    if kv.host is not None and kv.host.num_blocks == blocks:
        return kv.host
    return HostTier.of(kv, spec.host_kv_tokens)


def _announce(spec: StageSpec, stage: Stage, events: EventWriter, raw: dict, began: float) -> None:
    memory = stage.memory()
    log.info("stage %s of %s: layers %s loaded and bound in %.2f s", spec.stage_index, spec.pipeline_id,
             list(spec.layers), time.monotonic() - began)
    events.emit(
        "ready",
        pipeline_id=spec.pipeline_id,
        stage_index=spec.stage_index,
        pid=os.getpid(),
        weight_bytes=memory.weight_bytes,
        kv_bytes=memory.kv_cache_bytes,
        kv_tokens=memory.kv_tokens,
        spec_digest=spec_digest(raw),
    )


def _respec(running: dict, path: str) -> dict:
    """The new spec at ``path``, if this process can take it in place (the agent asks only then)."""
    wanted = spec_file_read(path)
    if blocker := respec_blocker(running, wanted):
        raise SpecError(f"cannot take the spec {path} in place: {blocker}")
    return wanted


def warm_up() -> None:
    """The fork server's (fork_server.py): build and run a two-layer stage of a made-up tiny model once,
    so what torch does on first use (lazy imports: sympy through a meta tensor's first ``to_empty``,
    0.6-1 s; first kernels) is done once, before any stage is forked, not during a handover's pause."""
    config = ModelConfig(model_type="llama", hidden_size=8, num_layers=2, num_heads=2, num_kv_heads=1,
                         head_dim=4, intermediate_size=16, vocab_size=16)
    with torch.inference_mode():
        stage = Stage(config, 0, 2, kv_tokens=32)
        stage.forward(Batch.of_tokens([0], [[1, 2]], [0]))
        stage.kv.free(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="stage spec JSON file (docs/contracts.md §1)")
    parser.add_argument("--spec-inbox", action="store_true",
                        help="take new specs in place from stdin, one path a line")
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    events = EventWriter()
    stop, replaced, inbox = threading.Event(), threading.Event(), SpecInbox()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: (replaced.set(), stop.set()))
    if args.spec_inbox:
        inbox.listen(sys.stdin)
    try:
        serve(spec_file_read(args.spec), events, stop, replaced, inbox)
    except Exception as exc:  # the agent must learn why: print it as an event, then crash
        log.exception("stage failed")
        events.emit("error", message=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        tracing_shutdown()  # before os._exit, which skips atexit
    return 0


if __name__ == "__main__":
    exit_code = main()
    # Everything that matters is closed or flushed by now; the interpreter's own finalization (a
    # full garbage collection over torch's objects) takes seconds, and while a stage lingers its
    # replacement cannot bind the same address. Skip it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
