"""The load side of ``demand_bench.py``: a compressed day of demand per model, open-loop clients that
follow it, and the arithmetic of what they saw (share of requests within the targets, card-seconds).

The curve, the arrival schedule and the arithmetic are pure (tests/benchmarks/test_demand_load.py);
``DayClients`` sends the requests through the official ``openai`` library, streaming, so each one's
time to first token and time per output token are what a client measures.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.steady_clients import PROMPTS

MAX_IN_FLIGHT = 400  # a safety bound only: the clients are open loop, a late answer never delays an arrival


def multiplier(t: float, *, day_s: float, phase: float, low: float = 0.2, high: float = 3.0) -> float:
    """A model's load at ``t`` seconds into the day, in multiples of its planned capacity: ``low`` at
    the start of its day, ``high`` half a day later, back to ``low`` at its end (a raised cosine);
    ``phase`` (a fraction of the day) shifts it, so two models with phases 0 and 0.5 peak in turn."""
    if day_s <= 0:
        raise ValueError(f"day_s must be positive, got {day_s}")
    return low + (high - low) * (1 - math.cos(2 * math.pi * (t / day_s + phase))) / 2


def mean_multiplier(low: float = 0.2, high: float = 3.0) -> float:
    """The curve's mean over a whole day: halfway between its ends."""
    return (low + high) / 2


def arrivals(rate_at, *, start: float, end: float, step_s: float = 0.01) -> list[float]:
    """Arrival instants in [start, end) for a rate (requests/s) that changes with time: one each time
    the integral of ``rate_at`` crosses a whole number (the offered load, without Poisson noise, so the
    three runs of the benchmark face the same requests at the same instants)."""
    times, owed, t = [], 0.0, start
    while t < end:
        owed += rate_at(t) * step_s
        t += step_s
        while owed >= 1.0:
            owed -= 1.0
            times.append(t)
    return times


@dataclass(frozen=True)
class Targets:
    ttft_ms: float
    tpot_ms: float


@dataclass
class Request:
    """One request as its client saw it (``time.monotonic()`` instants)."""

    model: str
    started: float
    first_token: float | None = None
    ended: float = 0.0
    ok: bool = False
    tokens: int = 0
    error: str = ""

    def within(self, targets: Targets) -> bool:
        """Completed, its first token within the TTFT target and (two tokens or more) its time per
        output token after the first within the TPOT target. A failed request is a miss."""
        if not self.ok or self.first_token is None:
            return False
        if (self.first_token - self.started) * 1000 > targets.ttft_ms:
            return False
        tpot_ms = (self.ended - self.first_token) * 1000 / max(1, self.tokens - 1)
        return self.tokens < 2 or tpot_ms <= targets.tpot_ms


def attainment(requests: Sequence[Request], targets: dict[str, Targets]) -> float | None:
    """The share of ``requests`` within their model's targets (None when there are none)."""
    if not requests:
        return None
    return sum(r.within(targets[r.model]) for r in requests) / len(requests)


def card_seconds(samples: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """Cards held over [start, end] from ``(instant, cards held)`` samples, oldest first: each sample's
    count holds until the next one (the first from ``start``, the last until ``end``)."""
    inside = [(max(t, start), n) for t, n in samples if t < end]
    if not inside:
        return 0.0
    before = [n for t, n in samples if t <= start]
    held = before[-1] if before else inside[0][1]
    total, at = 0.0, start
    for t, n in inside:
        total += held * (t - at)
        held, at = n, t
    return total + held * (end - at)


class DayClients:
    """Requests to each model at the instants of its schedule, through ``base_url`` with ``api_key``,
    each in a thread of its own (open loop: an answer's lateness never delays the next arrival)."""

    def __init__(self, *, base_url: str, api_key: str, max_tokens: int, timeout_s: float = 120.0) -> None:
        import openai

        self.max_tokens = max_tokens
        self._openai = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=timeout_s,
                                     max_retries=0)
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self.requests: list[Request] = []
        self.skipped = 0  # arrivals that found MAX_IN_FLIGHT requests unanswered

    def run(self, schedule: dict[str, list[float]], *, began: float) -> None:
        """Send each model's requests at ``began`` + its instants (seconds); return once every one ended."""
        merged = sorted((t, model) for model, times in schedule.items() for t in times)
        threads = []
        for k, (t, model) in enumerate(merged):
            time.sleep(max(0.0, began + t - time.monotonic()))
            if not self._slots.acquire(blocking=False):
                self.skipped += 1
                continue
            thread = threading.Thread(target=self._one, args=(model, k % len(PROMPTS)), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(timeout=300)

    def _one(self, model: str, prompt: int) -> None:
        request = Request(model=model, started=time.monotonic())
        try:
            stream = self._openai.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPTS[prompt]}],
                max_tokens=self.max_tokens, temperature=0.8, seed=1000 + prompt, stream=True,
                stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.usage is not None:
                    request.tokens = chunk.usage.completion_tokens
                if request.first_token is None and chunk.choices and chunk.choices[0].delta.content:
                    request.first_token = time.monotonic()
            request.ok = True
            request.first_token = request.first_token or time.monotonic()  # an answer of no text
        except Exception as exc:  # what the client saw is the measurement: keep it, go on
            request.error = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            request.ended = time.monotonic()
            with self._lock:
                self.requests.append(request)
            self._slots.release()
