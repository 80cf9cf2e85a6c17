"""Emulation pacing (contracts §1 ``emulation``): make a CPU stage take the time its modeled GPU would.

The model is the roofline of one step: it reads the stage's weights once and each sequence's cached
K/V, and does the matrix products of every new token, so its time is ``max(bytes / bandwidth, FLOPs /
peak)``. ``time_scale`` stretches that so modeled time dominates real CPU time; the stage then sleeps
what its real compute did not take, and an emulated fleet shows the speed ratios of the devices it
claims to have, which is what the planner and the dashboard are tested against.

Two knobs slow an emulated card down from its catalog figures. ``speed_factor`` is static: a card
that is simply slower (or faster) than its spec sheet. The throttle factor is live: the agent writes
``{"factor": f}`` to the spec's ``throttle_file`` while the card is made to throttle (contracts §3
``set_throttle``), and the pacer re-reads the file at most once a second (only when its mtime
changed), so a step takes ``modeled / (speed_factor x f)`` from then on, without a restart.

A copy back from the host KV tier (``host_tier.py``) takes ``time_scale x bytes / host_link_gbs``:
the card's link to its host, which neither knob slows (they stand for the card's clocks), with the
bytes of a 16-bit cache, as the card holds it and the planner prices it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from contracts.stage_spec import Emulation

from .stage import Batch, Stage

RECHECK_S = 1.0  # how often the throttle file is looked at


class ThrottleFile:
    """The live throttle factor an agent writes for one emulated device; 1.0 when absent or unreadable."""

    def __init__(self, path: str | None, clock: Callable[[], float] = time.monotonic):
        self.path = path
        self._clock = clock
        self._next_check = float("-inf")
        self._mtime: int | None = None
        self._factor = 1.0

    def factor(self) -> float:
        if self.path is None:
            return 1.0
        now = self._clock()
        if now < self._next_check:
            return self._factor
        self._next_check = now + RECHECK_S
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            self._mtime, self._factor = None, 1.0
            return self._factor
        if mtime != self._mtime:
            self._mtime, self._factor = mtime, self._read()
        return self._factor

    def _read(self) -> float:
        try:
            factor = float(json.loads(Path(self.path).read_text())["factor"])
        except (OSError, ValueError, KeyError, TypeError):
            return self._factor  # mid-rewrite or malformed: keep the last good figure
        return factor if 0 < factor <= 1 else self._factor


def read_weight_bytes(stage: Stage) -> int:
    """Weight bytes one step of ``stage`` reads on the card it stands for: every matrix at the stage's
    precision, floating-point tensors at 16 bits (what a GPU holds them at, whatever dtype the CPU
    stage computes in: the planner prices them so), and not the embedding table, a lookup that reads
    a few rows, unless the ``lm_head`` reads it as its tied weight."""
    embedding = stage.embed.weight if stage.embed is not None else None
    tied = embedding is not None and stage.lm_head is not None and stage.lm_head.weight is embedding
    seen = {embedding.data_ptr()} if embedding is not None and not tied else set()
    total = 0
    for tensor in [*stage.parameters(), *stage.buffers()]:
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * 2 if tensor.is_floating_point() else tensor.nbytes
    return total


class Pacer:
    """Sleeps out each step of a stage to its modeled duration on the emulated device."""

    def __init__(self, stage: Stage, emulation: Emulation, clock: Callable[[], float] = time.monotonic):
        self.emulation = emulation
        self.throttle = ThrottleFile(emulation.throttle_file, clock)
        config = stage.config
        self.layers = stage.end - stage.start
        self.q_size = config.q_size
        layer_params = (
            config.hidden_size * (config.q_size + 2 * config.kv_size)
            + config.q_size * config.hidden_size
            + 3 * config.hidden_size * config.intermediate_size
        )
        self.params_per_token = layer_params * self.layers
        self.head_params = config.vocab_size * config.hidden_size if stage.is_last else 0
        self.weight_bytes = read_weight_bytes(stage)
        self.kv_bytes_per_token = stage.kv.bytes_per_token
        self.copy_bytes_per_token = 2 * 2 * config.kv_size * self.layers  # K and V of its layers, 16-bit

    def modeled_s(self, batch: Batch) -> float:
        """Seconds the emulated device needs for ``batch``: ``time_scale``, ``speed_factor`` and the
        live throttle factor included."""
        contexts = [s + n for s, n in zip(batch.start_positions, batch.lengths)]
        read = self.weight_bytes + self.kv_bytes_per_token * sum(contexts)
        flops = (
            2 * self.params_per_token * batch.num_tokens
            + 4 * self.layers * self.q_size * sum(n * c for n, c in zip(batch.lengths, contexts))
            + 2 * self.head_params * len(batch.seq_ids)
        )
        e = self.emulation
        roofline = max(read / (e.memory_bandwidth_gbs * 1e9), flops / (e.fp16_tflops * 1e12))
        return e.time_scale * roofline / (e.speed_factor * self.throttle.factor())

    def pace(self, batch: Batch, elapsed_s: float) -> float:
        """Sleep whatever of the modeled time the real compute (``elapsed_s``) did not take; returns it."""
        return _sleep_rest(self.modeled_s(batch), elapsed_s)

    def copy_s(self, tokens: int) -> float:
        """Seconds the emulated card's host link needs to copy ``tokens`` tokens' KV back (0 when the
        spec gives no link figure)."""
        link = self.emulation.host_link_gbs
        if link is None:
            return 0.0
        return self.emulation.time_scale * tokens * self.copy_bytes_per_token / (link * 1e9)

    def pace_copy(self, tokens: int, elapsed_s: float) -> float:
        """Sleep whatever of the modeled copy of ``tokens`` tokens the real one (``elapsed_s``) did not
        take; returns it."""
        return _sleep_rest(self.copy_s(tokens), elapsed_s)


def _sleep_rest(modeled_s: float, elapsed_s: float) -> float:
    remaining = modeled_s - elapsed_s
    if remaining > 0:
        time.sleep(remaining)
    return max(0.0, remaining)
