"""Emulation pacing (contracts §1 ``emulation``): make a CPU stage take the time its modeled GPU would.

The model is the roofline of one step: it reads the stage's weights once and each sequence's cached
K/V, and does the matrix products of every new token, so its time is ``max(bytes / bandwidth, FLOPs /
peak)``. ``time_scale`` stretches that so modeled time dominates real CPU time; the stage then sleeps
what its real compute did not take, and an emulated fleet shows the speed ratios of the devices it
claims to have, which is what the planner and the dashboard are tested against.
"""

from __future__ import annotations

import time

from contracts.stage_spec import Emulation

from .stage import Batch, Stage


class Pacer:
    """Sleeps out each step of a stage to its modeled duration on the emulated device."""

    def __init__(self, stage: Stage, emulation: Emulation):
        self.emulation = emulation
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
        self.weight_bytes = stage.memory().weight_bytes
        self.kv_bytes_per_token = stage.kv.bytes_per_token

    def modeled_s(self, batch: Batch) -> float:
        """Seconds the emulated device needs for ``batch``, ``time_scale`` included."""
        contexts = [s + n for s, n in zip(batch.start_positions, batch.lengths)]
        read = self.weight_bytes + self.kv_bytes_per_token * sum(contexts)
        flops = (
            2 * self.params_per_token * batch.num_tokens
            + 4 * self.layers * self.q_size * sum(n * c for n, c in zip(batch.lengths, contexts))
            + 2 * self.head_params * len(batch.seq_ids)
        )
        e = self.emulation
        return e.time_scale * max(read / (e.memory_bandwidth_gbs * 1e9), flops / (e.fp16_tflops * 1e12))

    def pace(self, batch: Batch, elapsed_s: float) -> float:
        """Sleep whatever of the modeled time the real compute (``elapsed_s``) did not take; returns it."""
        remaining = self.modeled_s(batch) - elapsed_s
        if remaining > 0:
            time.sleep(remaining)
        return max(0.0, remaining)
