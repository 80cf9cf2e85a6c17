"""Clients that stream chat requests through the gateway without pause, for watching a change happen.

Both the live re-placement tests (tests/e2e/test_handover.py) and ``replacement_bench.py`` need the
same thing: a few clients of the official ``openai`` library streaming short seeded chat requests back
to back (or at a set pace) while something is done to the system, and afterwards what they saw:
requests ok and failed, the longest time without a completed request, latency percentiles, and
whether every seeded answer equals the answer the same request got when nothing was changing.

Each request cycles through a fixed list of prompts with a seed per prompt and ``temperature`` > 0,
so its text depends only on (prompt, seed): a request resumed elsewhere after its pipeline changed
must give exactly the text an uninterrupted one gives (docs/gateway.md, "Request migration").
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

# Paced: unanswered requests at once, at most two a client and 12 in all (under the gateway's 16 a key
# by default); an arrival that finds them all out (a stall) is skipped, not sent late in a burst.
MAX_IN_FLIGHT_PER_CLIENT, MAX_IN_FLIGHT = 2, 12
PROMPTS = (
    "Name three colours.",
    "What is two plus two?",
    "Say hello to a friend.",
    "Write one word about the sea.",
    "Which month comes after May?",
    "Count from one to five.",
)


@dataclass
class Outcome:
    """One request as its client saw it."""

    client: int
    prompt: int  # index into PROMPTS
    started: float  # time.monotonic()
    ended: float = 0.0
    ok: bool = False
    error: str = ""
    text: str = ""
    ids: set[str] = field(default_factory=set)  # response ids seen across its chunks (one when right)
    completion_tokens: int | None = None


@dataclass(frozen=True)
class Window:
    """What the clients saw between two instants (e.g. while a change ran)."""

    ok: int
    failed: int
    errors: tuple[str, ...]
    longest_gap_s: float  # the longest time without a completed request, the window's edges included
    gap_from_s: float  # where that gap began, in seconds after the window's start (to read beside events)
    p50_s: float | None
    p99_s: float | None

    def line(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f} ms"
        return (f"ok {self.ok}, failed {self.failed}, longest gap {self.longest_gap_s * 1000:.0f} ms "
                f"(from +{self.gap_from_s:.1f} s), p50 {ms(self.p50_s)}, p99 {ms(self.p99_s)}")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class SteadyClients:
    """``clients`` clients streaming requests through ``base_url`` until ``stop()``.

    ``interval_s`` 0: each client sends its next request as soon as its last one ended (back to back).
    Otherwise arrivals follow a fixed schedule, one every ``interval_s / clients`` (each client's every
    ``interval_s``, the clients staggered over one interval), whether or not the earlier requests ended
    (open loop, within ``MAX_IN_FLIGHT``): a steady offered rate independent of how fast the system
    answers. Clients that wait for their last request before the next would line up behind any stall
    and stay bunched after it, so every later interval would hold one burst of completions and a gap
    the system did not cause.
    """

    def __init__(self, *, base_url: str, api_key: str, model: str, clients: int = 4, max_tokens: int = 12,
                 temperature: float = 0.8, interval_s: float = 0.0, timeout_s: float = 120.0) -> None:
        import openai

        self.model, self.max_tokens, self.temperature = model, max_tokens, temperature
        self.interval_s = interval_s
        self._openai = openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, timeout=timeout_s,
                                     max_retries=0)
        self._count = clients
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.outcomes: list[Outcome] = []

    def start(self) -> SteadyClients:
        if self.interval_s > 0:
            self._spawn(self._dispatch, "dispatcher")
        else:
            for client in range(self._count):
                self._spawn(self._back_to_back, f"client-{client}", client)
        return self

    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        thread.start()
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def stop(self) -> list[Outcome]:
        self._stopping.set()
        for _ in range(2):  # the dispatcher is among the first pass; the second has what it started last
            with self._lock:
                threads = list(self._threads)
            for thread in threads:
                thread.join(timeout=180)
        with self._lock:
            return list(self.outcomes)

    def one(self, prompt: int, client: int = -1) -> Outcome:
        """One request now, in the calling thread."""
        outcome = Outcome(client=client, prompt=prompt, started=time.monotonic())
        try:
            stream = self._openai.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": PROMPTS[prompt]}],
                max_tokens=self.max_tokens, temperature=self.temperature, seed=1000 + prompt, stream=True,
                stream_options={"include_usage": True},
            )
            parts = []
            for chunk in stream:
                outcome.ids.add(chunk.id)
                if chunk.usage is not None:
                    outcome.completion_tokens = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
            outcome.text, outcome.ok = "".join(parts), True
        except Exception as exc:  # what the client saw is the measurement: keep it, go on
            outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.ended = time.monotonic()
        return outcome

    def _back_to_back(self, client: int) -> None:
        prompt = client % len(PROMPTS)
        while not self._stopping.is_set():
            self._record(self.one(prompt, client))
            prompt = (prompt + 1) % len(PROMPTS)

    def _dispatch(self) -> None:
        step = self.interval_s / self._count
        in_flight = threading.BoundedSemaphore(min(MAX_IN_FLIGHT, self._count * MAX_IN_FLIGHT_PER_CLIENT))
        prompts = [client % len(PROMPTS) for client in range(self._count)]
        began, k = time.monotonic(), 0
        while not self._stopping.wait(max(0.0, began + k * step - time.monotonic())):
            if not in_flight.acquire(blocking=False):
                k += 1
                continue
            client, k = k % self._count, k + 1
            prompt, prompts[client] = prompts[client], (prompts[client] + 1) % len(PROMPTS)
            self._spawn(self._paced_one, f"client-{client}", prompt, client, in_flight)

    def _paced_one(self, prompt: int, client: int, in_flight: threading.BoundedSemaphore) -> None:
        try:
            self._record(self.one(prompt, client))
        finally:
            in_flight.release()

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def window(self, start: float, end: float) -> Window:
        """Requests that ended in [start, end]; the gap counts from ``start`` to the first completion
        and from the last to ``end`` too, so a window with no completion is one gap of its length."""
        with self._lock:
            inside = [o for o in self.outcomes if start <= o.ended <= end]
        done = sorted(o.ended for o in inside if o.ok)
        edges = [start, *done, end]
        latencies = [o.ended - o.started for o in inside if o.ok]
        gap, gap_from = max((b - a, a) for a, b in zip(edges, edges[1:]))
        return Window(
            ok=len(done), failed=sum(not o.ok for o in inside),
            errors=tuple(o.error for o in inside if not o.ok),
            longest_gap_s=gap, gap_from_s=round(gap_from - start, 2),
            p50_s=percentile(latencies, 0.5), p99_s=percentile(latencies, 0.99),
        )


def mismatches(outcomes: list[Outcome], expected: dict[int, str]) -> list[str]:
    """Every answer that differs from the answer its prompt got without a change, or that carried
    more than one response id, or whose usage disagrees with nothing being produced."""
    problems = []
    for o in outcomes:
        if not o.ok:
            continue
        if o.prompt in expected and o.text != expected[o.prompt]:
            problems.append(f"prompt {o.prompt}: {o.text!r} != {expected[o.prompt]!r}")
        if len(o.ids) != 1:
            problems.append(f"prompt {o.prompt}: response ids {sorted(o.ids)}")
        if not o.completion_tokens:
            problems.append(f"prompt {o.prompt}: usage {o.completion_tokens}")
    return problems
