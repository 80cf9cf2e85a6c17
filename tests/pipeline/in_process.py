"""A whole pipeline in one process: the real head and relay loops, their frames delivered in order
through JSON as on the wire, without sockets or processes, so a test can run many requests at several
precisions in seconds and reach into any stage's cache."""

from __future__ import annotations

import io
import json
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from contracts.precision import Precision
from contracts.stage_spec import StageSpec
from worker_runtime.events import EventWriter
from worker_runtime.frames import Frame
from worker_runtime.head import HeadLoop
from worker_runtime.host_tier import HostTier
from worker_runtime.relay import RelayLoop
from worker_runtime.stage import Stage
from worker_runtime.stats import StageStats
from worker_runtime.structured import Grammars
from worker_runtime.transport import Incoming
from worker_runtime.worker import StageWorker

from .harness import pipeline_specs

CLIENT = b"client"


class Wire:
    """Stage ``index``'s transport: what it sends is queued for the pipeline to deliver."""

    bytes_sent = bytes_received = rejected = 0

    def __init__(self, pipeline: InProcessPipeline, index: int):
        self.pipeline, self.index = pipeline, index

    def send_next(self, header, tensors=()):
        self.pipeline.post(self.index + 1, header, tensors)
        return 1

    def send_head(self, header, tensors=()):
        self.pipeline.post(0, header, tensors)

    def reply(self, client, header, tensors=()):
        self.pipeline.replies.append(json.loads(json.dumps(header)))

    def next_linked(self) -> bool:
        return True


class InProcessPipeline:
    def __init__(self, model: Path, num_layers: int, num_stages: int, *, bits: int = 16, **overrides):
        self.specs: list[StageSpec] = pipeline_specs(model, num_layers, num_stages, bits=bits, **overrides)
        self.queue: deque[tuple[int, dict, list]] = deque()
        self.replies: list[dict] = []
        self.submitted = 0
        self.stages = [Stage.load(model, *spec.layers, precision=Precision(bits), kv_tokens=spec.kv_tokens)
                       for spec in self.specs]
        for stage, spec in zip(self.stages, self.specs):
            if spec.host_kv_tokens:
                stage.kv.host = HostTier.of(stage.kv, spec.host_kv_tokens)
        grammars = Grammars(model, self.stages[-1].config.vocab_size)
        workers = [StageWorker(stage, StageStats(), grammars=grammars if stage is self.stages[-1] else None)
                   for stage in self.stages]
        self.head = HeadLoop(self.specs[0], workers[0], Wire(self, 0), EventWriter(io.StringIO()),
                             warmed=True)
        self.relays = [RelayLoop(spec, worker, Wire(self, i), EventWriter(io.StringIO()), f"i{i}")
                       for i, (spec, worker) in enumerate(zip(self.specs, workers)) if i]
        for relay in self.relays:
            self.head.on_heartbeat({"type": "heartbeat", **relay_heartbeat(relay)})
        self.deliver()
        assert self.head.health()["ok"], self.head.health()

    def post(self, index: int, header: dict, tensors) -> None:
        self.queue.append((index, json.loads(json.dumps(header)), [t.clone() for t in tensors]))

    def deliver(self) -> None:
        while self.queue:
            index, header, tensors = self.queue.popleft()
            message = Incoming(Frame(header, tensors), b"")
            (self.head if index == 0 else self.relays[index - 1]).handle(message)

    def run(self, jobs: list[tuple],
            each_step: Callable[[int], object] = lambda n: None) -> list[list[int] | str]:
        """Submit ``jobs`` (prompt, max_tokens[, more submit fields: sampling, speculate, ...]) at once,
        greedy unless a job says otherwise, and run until all end: each one's tokens, or its error's
        kind. ``each_step(n)`` is called before the head's ``n``-th step."""
        self.replies.clear()
        self.submitted += len(jobs)
        ids = [f"r{self.submitted - len(jobs) + i}" for i in range(len(jobs))]
        for request_id, (prompt, max_tokens, *more) in zip(ids, jobs):
            self.head.on_submit(CLIENT, {"request_id": request_id, "prompt": prompt,
                                         "max_tokens": max_tokens, **(more[0] if more else {})})
        steps = 0
        while self.head.scheduler.requests:
            each_step(steps)
            steps += 1
            self.head.step()
            if not self.queue and self.head.scheduler.held:  # waiting for drafts from a draft pipeline
                time.sleep(0.001)
            self.deliver()
        self.head.step()  # the head's next turn tells the other stages which sequences ended
        self.deliver()
        results: dict[str, list[int] | str] = {request_id: [] for request_id in ids}
        for reply in self.replies:
            if reply["type"] == "tokens":
                for request_id, token, _ in reply["items"]:
                    results[request_id].append(token)
            elif reply["type"] == "error":
                results[reply["request_id"]] = reply["kind"]
        return [results[request_id] for request_id in ids]

    def stage_stats(self) -> list[dict]:
        return [self.head.own_stats()] + [relay.snapshot() for relay in self.relays]


def relay_heartbeat(relay: RelayLoop) -> dict:
    kv = relay.worker.stage.kv
    return {"stage_index": relay.spec.stage_index, "incarnation": relay.incarnation, "linked": True,
            "kv_capacity": kv.capacity_tokens, "block_size": kv.block_size, "stats": {}}
