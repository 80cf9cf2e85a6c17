"""The cost of tracing on serving: gateway + pipeline throughput with tracing off, sampled at 0.01, and
every request traced, side by side in one run.

    .venv/bin/python benchmarks/tracing_bench.py [--rounds 5 --requests 24 --clients 4 --max-tokens 16]

Three identical systems run at once, each a daphne gateway serving a two-stage pipeline of the demo
model (``worker_runtime.make_demo_model``, small: the pipeline's compute is short, so the per-request
work of the gateway and the stages, tracing's included, weighs as much as it can):

- **off**: ``OTEL_TRACES_EXPORTER`` unset (no span object is made);
- **0.01**: ``otlp,motley`` with ``parentbased_traceidratio`` at 0.01: spans to an OTLP/HTTP
  receiver (a collector's stand-in) and into the gateway's trace store, stages posting theirs to it;
- **1.0**: the same with every request sampled.

Rounds go through the three in turn (the order rotating), one system loaded at a time, so load from
other processes falls on all alike: ``--clients`` concurrent OpenAI clients send ``--requests``
completions of ``--max-tokens`` tokens. Two figures a round: the completion tokens over its wall time,
and the CPU time the system's processes (the gateway and both stages) spent per 1,000 of them. On a
shared host the first swings with whatever else runs; the second hardly does, and on a CPU-bound
system throughput is its inverse, so it is what tells a cost of a few per cent. Prints each system's
medians and their ratios to tracing off (goal: 0.01 within 2 %). Not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from tests.pipeline.harness import pipeline_specs  # noqa: E402
from tests.support.live_gateway import live_gateway  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402
from worker_runtime.make_demo_model import parse_args, write_demo_model  # noqa: E402

LAYERS = 4
MODEL_ARGS = ["--layers", str(LAYERS), "--hidden", "128", "--intermediate", "256", "--heads", "4",
              "--kv-heads", "2", "--max-positions", "512"]
RATIOS = {"off": None, "0.01": "0.01", "1.0": "1.0"}


@contextmanager
def system(model: Path, work: Path, ratio: str | None,
           receiver: OtlpReceiver) -> Iterator[tuple[str, str, list[psutil.Process]]]:
    """A daphne gateway and its two-stage pipeline, tracing at ``ratio`` (None: off); yields the
    gateway's ``/v1`` URL, an API key and the three processes."""
    tracing = {} if ratio is None else {
        **receiver.env(), "OTEL_TRACES_EXPORTER": "otlp,motley",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": ratio,
        "OTEL_BSP_SCHEDULE_DELAY": "5000"}  # the SDK's default, not the receiver's test delay
    with live_gateway(pipeline_specs(model, LAYERS, 2), model, work, tracing) as gateway:
        pids = [gateway.server.pid, *gateway.pipeline.pids()]
        yield gateway.server.base_url, gateway.install.key, [psutil.Process(pid) for pid in pids]


async def load(base: str, key: str, requests: int, clients: int, max_tokens: int) -> float:
    """Completion tokens per second of ``requests`` completions from ``clients`` concurrent clients."""
    queue = list(range(requests))
    tokens = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while queue:
            i = queue.pop()
            response = await http.post(f"{base}/completions", json={
                "model": "demo", "prompt": f"request {i} of the tracing benchmark", "max_tokens": max_tokens,
                "temperature": 0})
            response.raise_for_status()
            tokens += response.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return tokens / (time.perf_counter() - started)


def cpu_s(processes: list[psutil.Process]) -> float:
    return sum(sum(p.cpu_times()[:2]) for p in processes)  # user + system


def measured(base: str, key: str, processes: list[psutil.Process], args) -> tuple[float, float]:
    """A round on one system: its tokens/s, and its processes' CPU seconds per 1,000 tokens."""
    before, started = cpu_s(processes), time.perf_counter()
    rate = asyncio.run(load(base, key, args.requests, args.clients, args.max_tokens))
    tokens = rate * (time.perf_counter() - started)
    return rate, (cpu_s(processes) - before) / tokens * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        model = work / "model"
        write_demo_model(parse_args([str(model), *MODEL_ARGS]))
        receiver = stack.enter_context(OtlpReceiver())
        systems = {}
        for name, ratio in RATIOS.items():
            (work / name).mkdir()
            systems[name] = stack.enter_context(system(model, work / name, ratio, receiver))
        for base, key, _ in systems.values():  # warm-up: imports, the first compiled paths
            asyncio.run(load(base, key, args.clients, args.clients, args.max_tokens))
        rates: dict[str, list[float]] = {name: [] for name in systems}
        cpus: dict[str, list[float]] = {name: [] for name in systems}
        names = list(systems)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                rate, cpu = measured(*systems[name], args)
                rates[name].append(rate)
                cpus[name].append(cpu)
        spans = len(receiver.spans)
    off, off_cpu = statistics.median(rates["off"]), statistics.median(cpus["off"])
    print(f"{args.rounds} rounds of {args.requests} requests x {args.max_tokens} tokens, "
          f"{args.clients} clients; {spans} spans at the collector's stand-in by the last round")
    print("| tracing | tokens/s (median of rounds) | vs off | CPU s / 1000 tokens (median) | off / this |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        rate, cpu = statistics.median(rates[name]), statistics.median(cpus[name])
        print(f"| {name} | {rate:.1f} ({' '.join(f'{v:.0f}' for v in rates[name])}) | {rate / off:.3f}x "
              f"| {cpu:.3f} ({' '.join(f'{v:.2f}' for v in cpus[name])}) | {off_cpu / cpu:.3f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
