"""Prefix caching, part (a): what reusing the KV cache buys a chat application (``prefix_bench.py chat``).

`make run`'s system (``manage.py run_local``, SmolLM2-135M-Instruct on the demo fleet) and the
official ``openai`` client. Conversations of ``--turns`` turns under one ~700-token system prompt,
each turn resending the whole history (as chat applications do), one conversation at a time: the
time to first token of each turn with the deployment's ``prefix_caching`` off, then on (a PATCH of
the deployment: the stages take the new spec in place). Goal: later turns at most 0.2x of the same
turns without caching. Then throughput at the same p99: ``--clients`` concurrent conversations for
``--window-s`` each, caching off at the lowest concurrency, caching on at each concurrency; the most
turns a second caching serves with its p99 time to first token within the uncached p99, against the
uncached throughput. Goal: at least 1.5x. The peer timeouts are raised (``--peer-timeout-s``;
benchmarks/demo_system.py says why).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.demo_system import demo_system  # noqa: E402
from benchmarks.gpu_check_serve import REPO  # noqa: E402
from benchmarks.replacement_bench import Api  # noqa: E402

TOPICS = ("rivers", "mountains", "deserts", "forests", "oceans", "islands", "glaciers", "volcanoes")
QUESTIONS = ("What is the largest one?", "Name another one.", "Where is it?", "Why is it known?",
             "Say one more fact.", "Which is the oldest?", "Give a short summary.")


def system_prompt(topic: str, sentences: int = 24) -> str:
    """Instructions on ``topic``, ~29 tokens a sentence in SmolLM2's tokenizer: 24 make a first turn's
    prompt of about 700 tokens with the chat template and a short question."""
    return " ".join(f"Rule {i + 1}: when asked about {topic}, answer briefly, in plain words, and mention "
                    f"fact number {i + 1} only if it helps." for i in range(sentences))


@dataclass
class Turn:
    ttft_s: float
    total_s: float
    text: str


def chat_turn(client, model: str, messages: list[dict], max_tokens: int) -> Turn:
    """One streamed turn: the time to its first content and to its end, and its text."""
    started = time.monotonic()
    first, parts = None, []
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                            temperature=0, stream=True)
    for chunk in stream:
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta:
            first = first or time.monotonic()
            parts.append(delta)
    end = time.monotonic()
    return Turn((first or end) - started, end - started, "".join(parts))


def conversation(client, model: str, topic: str, turns: int, max_tokens: int) -> list[Turn]:
    messages = [{"role": "system", "content": system_prompt(topic)}]
    seen = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        turn = chat_turn(client, model, messages, max_tokens)
        messages.append({"role": "assistant", "content": turn.text})
        seen.append(turn)
    return seen


def set_caching(api: Api, pk: int, on: bool) -> None:
    """PATCH the deployment and wait until every stage runs the spec saying so and the head serves."""
    response = api.client.patch(f"/api/v1/deployments/{pk}/", json={"prefix_caching": on})
    response.raise_for_status()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        d = api.get(f"/api/v1/deployments/{pk}/")
        if (d["status"] == "ready" and d["prefix_caching"] == on
                and all(s["state"] == "ready" for s in d["stages"] if s["wanted"])
                and all(p["phase"] == "serving" for p in d["pipelines"])):
            return
        time.sleep(0.5)
    raise RuntimeError(f"prefix_caching={on} did not reach the stages in time")


def ttft_by_turn(client, model: str, args: argparse.Namespace, topics: tuple[str, ...]) -> list[list[float]]:
    """Each conversation's turns, one conversation at a time: per turn, the times to first token."""
    by_turn: list[list[float]] = [[] for _ in range(args.turns)]
    for topic in topics:
        for i, turn in enumerate(conversation(client, model, topic, args.turns, args.max_tokens)):
            by_turn[i].append(turn.ttft_s)
    return by_turn


@dataclass
class Load:
    clients: int
    turns: int = 0
    ttfts: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.turns / self.seconds if self.seconds else 0.0

    @property
    def p99(self) -> float:
        ordered = sorted(self.ttfts)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("inf")


def load_window(make_client, model: str, clients: int, args: argparse.Namespace, salt: str) -> Load:
    """``clients`` threads each running conversations back to back for ``--window-s``, all under the
    window's one system prompt (``salt`` keeps what an earlier window cached from counting), each its
    own from its first question on; counted: the turns that ended inside the window and their times
    to first token."""
    load, lock, stop = Load(clients), threading.Lock(), threading.Event()
    started = time.monotonic()

    def client_loop(index: int) -> None:
        client, n = make_client(), 0
        while not stop.is_set():
            messages = [{"role": "system", "content": system_prompt(f"{TOPICS[0]} ({salt})")}]
            for i in range(args.turns):
                asked = QUESTIONS[i % len(QUESTIONS)]
                asked = asked if i else f"Conversation {index}.{n}. {asked}"
                messages.append({"role": "user", "content": asked})
                turn = chat_turn(client, model, messages, args.max_tokens)
                messages.append({"role": "assistant", "content": turn.text})
                if stop.is_set():
                    return
                with lock:
                    load.turns += 1
                    load.ttfts.append(turn.ttft_s)
            n += 1

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(args.window_s)
    stop.set()
    load.seconds = time.monotonic() - started
    for thread in threads:
        thread.join(120)
    return load


def run_chat(args: argparse.Namespace) -> dict:
    import openai

    with demo_system(args.work, peer_timeout_s=args.peer_timeout_s) as system:
        api, pk, model = system.api, system.pk, system.model

        def make_client():
            return openai.OpenAI(base_url=f"{system.base}/v1", api_key=system.key, timeout=300, max_retries=0)

        client = make_client()
        result: dict = {"turns": args.turns}
        for on in (False, True):
            set_caching(api, pk, on)
            topics = TOPICS[:args.conversations] if on else TOPICS[len(TOPICS) - args.conversations:]
            result["on" if on else "off"] = ttft_by_turn(client, model, args, topics)
        off, on = result["off"], result["on"]
        print("| turn | TTFT caching off (s, median) | TTFT caching on (s, median) | on / off |")
        print("|---:|---:|---:|---:|")
        for i in range(args.turns):
            a, b = statistics.median(off[i]), statistics.median(on[i])
            print(f"| {i + 1} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")
        later_off = statistics.median(t for turn in off[1:] for t in turn)
        later_on = statistics.median(t for turn in on[1:] for t in turn)
        print(f"turns 2-{args.turns}: {later_on:.3f} s against {later_off:.3f} s: "
              f"{later_on / later_off:.2f}x (goal <= 0.2x)")

        set_caching(api, pk, False)
        baseline = load_window(make_client, model, args.clients[0], args, "off")
        set_caching(api, pk, True)
        loads = [load_window(make_client, model, c, args, f"on{c}") for c in args.clients]
        within = [load for load in loads if load.p99 <= baseline.p99]
        best = max(within, key=lambda load: load.rate) if within else None
        print("| caching | clients | turns/s | p99 TTFT (s) |")
        print("|---|---:|---:|---:|")
        for label, load in [("off", baseline)] + [("on", load) for load in loads]:
            print(f"| {label} | {load.clients} | {load.rate:.2f} | {load.p99:.3f} |")
        ratio = best.rate / baseline.rate if best else 0.0
        print(f"throughput at the uncached p99 ({baseline.p99:.3f} s): {ratio:.2f}x (goal >= 1.5x)")
        figures = [vars(load) | {"rate": load.rate, "p99": load.p99} for load in [baseline, *loads]]
        result.update(later_ratio=later_on / later_off, throughput_ratio=ratio, loads=figures)
        return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "prefix")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--conversations", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--window-s", type=float, default=40.0)
    parser.add_argument("--peer-timeout-s", type=float, default=30.0)
    parser.add_argument("--json", type=Path)


def chat_bench(args: argparse.Namespace) -> None:
    result = run_chat(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
