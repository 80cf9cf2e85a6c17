"""Per-stage statistics of contracts §4: what telemetry shows and what the planner's predictions are
checked against.

Averages cover a sliding window (one second by default) so a dashboard sampling once a second sees
the present, not the whole run; ``steps`` and the byte counters count since the process started.

The ``decode_*`` figures cover only the window's decode steps (every sequence of the micro-batch
advances by one token; a prefill chunk in the micro-batch makes it another kind of step): their
compute time, sequences and KV tokens read. They are what the planner's calibration compares with
its predicted decode step at the same batch and context (controlplane/telemetry/calibration.py).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    at: float
    compute_s: float
    transfer_s: float
    batch_size: int
    tokens: int
    kv_tokens: int  # tokens of cache the step's sequences read, the new ones included

    @property
    def decode(self) -> bool:
        return self.tokens == self.batch_size > 0


class StageStats:
    """Collects step and idle times of one stage loop; :meth:`snapshot` renders the §4 dict."""

    def __init__(self, window_s: float = 1.0):
        self.window_s = window_s
        self.started = time.monotonic()
        self.steps = 0
        self.queue_depth = 0
        self._steps: deque[StepRecord] = deque()
        self._idle: deque[tuple[float, float]] = deque()

    def record_step(self, compute_s: float, transfer_s: float, batch_size: int, tokens: int,
                    kv_tokens: int = 0) -> None:
        self.steps += 1
        self._steps.append(StepRecord(time.monotonic(), compute_s, transfer_s, batch_size, tokens, kv_tokens))

    def record_idle(self, seconds: float) -> None:
        """Time the loop waited with nothing to compute: the pipeline bubble at this stage."""
        self._idle.append((time.monotonic(), seconds))

    def _trim(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._steps and self._steps[0].at < cutoff:
            self._steps.popleft()
        while self._idle and self._idle[0][0] < cutoff:
            self._idle.popleft()

    def snapshot(self, *, kv_used: int, kv_free: int, bytes_sent: int, bytes_received: int) -> dict:
        now = time.monotonic()
        self._trim(now)
        span = max(1e-9, min(self.window_s, now - self.started))
        steps = list(self._steps)
        n = len(steps) or 1
        compute = sum(s.compute_s for s in steps) / n
        transfer = sum(s.transfer_s for s in steps) / n
        idle = sum(s for _, s in self._idle)
        decode = [s for s in steps if s.decode]
        d = len(decode) or 1
        return {
            "step_ms": round((compute + transfer) * 1e3, 3),
            "compute_ms": round(compute * 1e3, 3),
            "transfer_ms": round(transfer * 1e3, 3),
            "tokens_per_s": round(sum(s.tokens for s in steps) / span, 1),
            "batch_size": round(sum(s.batch_size for s in steps) / n, 2),
            "queue_depth": self.queue_depth,
            "kv_tokens_used": kv_used,
            "kv_tokens_free": kv_free,
            "bytes_sent": bytes_sent,
            "bytes_received": bytes_received,
            "bubble_fraction": round(min(1.0, idle / span), 3),
            "steps": self.steps,
            "decode_steps": len(decode),
            "decode_ms": round(sum(s.compute_s for s in decode) / d * 1e3, 3),
            "decode_batch": round(sum(s.batch_size for s in decode) / d, 2),
            "decode_kv_tokens": round(sum(s.kv_tokens for s in decode) / d, 1),
        }
