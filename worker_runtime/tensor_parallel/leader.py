"""Rank 0 of a served tensor-parallel stage: the stage its pipeline sees.

:class:`LeadStage` stands where a :class:`~worker_runtime.stage.Stage` stands in the head and relay loops:
its ``forward`` tells the group the batch and runs rank 0's shard of it, and its ``kv`` is rank 0's cache
whose every change is told to the group first (:class:`MirroredKV`), so the others' block tables follow
(follow.py). :class:`GroupLeader` starts the other ranks (one process per card, on this node), waits until
they have loaded, keeps them in step under one lock, sends a keepalive while idle (their wait for the next
message would time out), and stops them. A rank that dies stops the stage: rank 0 exits with the reason,
and the agent restarts the group as a unit.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import torch

from contracts.stage_spec import StageSpec

from ..kv_cache import KVCache
from ..stage import Batch, StageMemory
from .rendezvous import host_store, join, wait_loaded

log = logging.getLogger(__name__)
KEEPALIVE_S = 5.0  # well inside rendezvous.COLLECTIVE_TIMEOUT
# The cache operations that change what a rank holds, as the head, relay and prefix index call them.
MIRRORED = frozenset({"allocate", "free", "attach", "commit", "evict", "clear"})


class GroupBroken(RuntimeError):
    """A rank of the group is gone: the stage cannot go on, its process exits with this message."""


class GroupLeader:
    """Rank 0's side of the group's control channel and of its member processes."""

    def __init__(self, spec: StageSpec):
        size = len(spec.tensor_group)
        self.store = host_store(size)
        self.followers = [_start_follower(spec, rank, self.store.port) for rank in range(1, size)]
        self.group, self.channel = join(0, size, self.store, spec.device)
        self.lock = threading.Lock()
        self._sent_at = time.monotonic()
        self._closing = threading.Event()
        self._watch: threading.Thread | None = None

    def exit_code(self, rank: int) -> int | None:
        return self.followers[rank - 1].poll()

    def wait_loaded(self) -> list[StageMemory]:
        """The other ranks' memory once all have loaded; then the keepalive and liveness watch start."""
        memories = wait_loaded(self.store, range(1, len(self.followers) + 1), self.exit_code)
        self._watch = threading.Thread(target=self._keep_alive, name="tensor-group-keepalive", daemon=True)
        self._watch.start()
        return memories

    @contextmanager
    def sending(self, message: dict):
        """Tell the group ``message``, then run the block, nothing else of the group's in between.
        :class:`GroupBroken` where a collective fails: a rank is gone."""
        with self.lock:
            try:
                self.channel.send(message)
                self._sent_at = time.monotonic()
                yield
            except RuntimeError as exc:
                raise GroupBroken(self.gone(exc)) from exc

    def gone(self, error: object) -> str:
        """What a failed collective means: which ranks exited, with their codes (waited for briefly:
        the broken connection is seen before the exit)."""
        deadline = time.monotonic() + 2.0
        while not (dead := self._exited()) and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = ", ".join(f"rank {rank} exited with code {code}" for rank, code in dead) or "no rank exited"
        return f"tensor-parallel group broken ({ranks}): {error}"

    def _exited(self) -> list[tuple[int, int]]:
        return [(rank, code) for rank in range(1, len(self.followers) + 1)
                if (code := self.exit_code(rank)) is not None]

    def close(self) -> None:
        """Stop the other ranks (they finish nothing: rank 0 holds every request's state)."""
        self._closing.set()
        with self.lock:
            try:
                self.channel.send({"op": "stop"})
            except RuntimeError as exc:  # a rank is gone already
                log.warning("could not tell the group to stop: %s", exc)
        for follower in self.followers:
            try:
                follower.wait(timeout=10)
            except subprocess.TimeoutExpired:
                follower.kill()

    def _keep_alive(self) -> None:
        """While the stage idles: a keepalive now and then, and an exit (code 1, the reason logged) as soon
        as a rank is gone; the agent then restarts the group as a unit."""
        while not self._closing.wait(0.5):
            broken = self.gone("its process ended") if self._exited() else None
            if broken is None and time.monotonic() - self._sent_at > KEEPALIVE_S:
                with self.lock:
                    try:
                        if not self._closing.is_set():
                            self.channel.send({"op": "noop"})
                            self._sent_at = time.monotonic()
                    except RuntimeError as exc:
                        broken = self.gone(exc)
            if broken is not None and not self._closing.is_set():
                log.error("%s: the stage stops", broken)
                logging.shutdown()
                os._exit(1)


class MirroredKV:
    """Rank 0's KV cache; every change in ``MIRRORED`` is told to the group before it is made here."""

    def __init__(self, kv: KVCache, leader: GroupLeader):
        object.__setattr__(self, "_kv", kv)
        object.__setattr__(self, "_leader", leader)

    def __getattr__(self, name: str):
        value = getattr(self._kv, name)
        if name not in MIRRORED:
            return value

        def mirrored(*args):
            with self._leader.sending({"op": "kv", "method": name, "args": list(args)}):
                return value(*args)
        return mirrored

    def __setattr__(self, name: str, value) -> None:
        setattr(self._kv, name, value)


class LeadStage:
    """Rank 0's shard, seen by its loops as the whole stage (see the module doc)."""

    def __init__(self, shard, leader: GroupLeader, others: list[StageMemory]):
        self.shard, self.leader, self.others = shard, leader, others
        self.kv = MirroredKV(shard.kv, leader)

    def __getattr__(self, name: str):
        return getattr(self.shard, name)

    def forward(self, batch: Batch, all_logits: bool = False) -> torch.Tensor:
        x = self.shard.first_layer_input(batch)  # a bad batch fails here, before the group hears of it
        # No ``all_logits``: only rank 0 holds the lm_head, the others return nothing.
        message = {"op": "forward", "seq_ids": batch.seq_ids, "starts": batch.start_positions,
                   "lengths": batch.lengths, "logit_rows": batch.logit_rows}
        with self.leader.sending(message):
            return self.shard.run(x, batch, all_logits)

    def memory(self) -> StageMemory:
        """The whole group's bytes: every rank's weights and KV cache, as one stage holds them."""
        mine, by_kind = self.shard.memory(), {}
        for memory in (mine, *self.others):
            for kind, nbytes in memory.weight_bytes_by_kind.items():
                by_kind[kind] = by_kind.get(kind, 0) + nbytes
        return StageMemory(by_kind, sum(m.kv_cache_bytes for m in (mine, *self.others)),
                           sum(m.kv_bytes_per_token for m in (mine, *self.others)), mine.kv_tokens)

    def close(self) -> None:
        self.leader.close()


def _start_follower(spec: StageSpec, rank: int, port: int) -> subprocess.Popen:
    """Rank ``rank``'s process: its spec on stdin; its log to this stage's stderr, never its stdout (the
    agent reads events there); it dies with this process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "worker_runtime.tensor_parallel.follow", "--rank", str(rank),
         "--port", str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent,
    )
    process.stdin.write(json.dumps(spec.to_json()).encode())
    process.stdin.close()
    return process


def _die_with_parent() -> None:
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
