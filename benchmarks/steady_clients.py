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
    """``clients`` threads streaming requests through ``base_url`` until ``stop()``.

    ``interval_s``: the least time between the starts of one client's requests (0: back to back),
    which sets a steady offered rate independent of how fast the system answers. Paced clients start
    staggered (client i after i/clients of an interval): started together they would arrive in bursts
    and leave a whole interval without a completion even in the steady state.
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
        for client in range(self._count):
            thread = threading.Thread(target=self._run, args=(client,), daemon=True, name=f"client-{client}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> list[Outcome]:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=180)
        return self.outcomes

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

    def _run(self, client: int) -> None:
        prompt = client % len(PROMPTS)
        self._stopping.wait(client * self.interval_s / self._count)
        while not self._stopping.is_set():
            outcome = self.one(prompt, client)
            with self._lock:
                self.outcomes.append(outcome)
            prompt = (prompt + 1) % len(PROMPTS)
            rest = self.interval_s - (outcome.ended - outcome.started)
            if rest > 0:
                self._stopping.wait(rest)

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
