"""``pipeline_bench.py --netns``: a 3-stage pipeline with each stage in its own network namespace,
over links shaped to fleet ``network_gbps`` (tests/support/netns.py), against the planner's price.

Reported: each hop of a prefill activation (benchmarks/netns_hops.py) measured against
``CostModel.hop_s`` on that link; and the pipeline's prefill throughput (prompt tokens per second to
the first token, seen by a client in the root namespace) against the prediction built the planner's
way: the sum of the stages' prefill times (measured here, in one process, since a CPU is not the
emulated card) and of the hops' prices. Decode activations (one token, a few hundred bytes) cross a
shaped link in well under a millisecond, so over these links only prefill shows the network.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import torch

from benchmarks.netns_hops import measure_hop, predicted_hop_s
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs, split_layers, wait_healthy
from tests.support import netns
from worker_runtime.chain import free_sequences, run_stages
from worker_runtime.stage import Batch, Stage

GBPS = [10.0, 25.0, 5.0]  # the three nodes' fleet network_gbps


def prompt(tokens: int) -> list[int]:
    return [(i * 7) % 200 + 1 for i in range(tokens)]


def stage_prefill_s(model: Path, layers: tuple[int, int], tokens: int, repeats: int) -> float:
    """One stage's prefill of ``tokens`` tokens, 1 thread, best of ``repeats``."""
    torch.set_num_threads(1)
    stage = Stage.load(model, *layers, kv_tokens=tokens + 64)
    best = float("inf")
    batch = Batch.of_tokens([0], [prompt(tokens)], [0])
    if layers[0] > 0:  # a later stage takes the previous one's hidden states
        batch = batch.with_hidden(torch.randn(tokens, stage.config.hidden_size))
    for _ in range(repeats):
        started = time.perf_counter()
        run_stages([stage], batch)
        best = min(best, time.perf_counter() - started)
        free_sequences([stage], [0])
    return best


async def time_to_first_token(head: str, tokens: int, repeats: int) -> float:
    async with PipelineClient(head, TOKEN, "bench", timeout_s=60) as client:
        await wait_healthy(client)
        best = float("inf")
        for _ in range(repeats):
            await asyncio.sleep(0.3)  # the links' token buckets refill, as between two requests
            started = time.perf_counter()
            async for _ in client.submit(prompt(tokens), max_tokens=1):
                break
            best = min(best, time.perf_counter() - started)
        return best


def run(model: Path, layers: int, hidden: int, tokens: int, repeats: int, workdir: Path) -> None:
    bounds = split_layers(layers, 3)
    with netns.network(GBPS) as net:
        print(f"3 nodes, fleet network_gbps {GBPS} shaped to {[g * 1e3 / netns.SCALE for g in GBPS]} Mbit/s "
              f"(tbf, 1/{netns.SCALE}); demo model {layers} layers, hidden {hidden}; prefill {tokens} tokens")
        hops = [measure_hop(net, k, k + 1, tokens, hidden, repeats) for k in range(2)]
        print("\n| hop | activation | measured (ms) | planner (ms) | measured / planner "
              "|\n|---|---:|---:|---:|---:|")
        for hop in hops:
            print(f"| n{hop.src} -> n{hop.dst} | {hop.nbytes / 1e3:.0f} kB | {hop.measured_s * 1e3:.1f} | "
                  f"{hop.predicted_s * 1e3:.1f} | {hop.measured_s / hop.predicted_s:.2f} |")
        specs = pipeline_specs(model, layers, 3, pipeline_id="bench",
                               hosts=[net.address(k) for k in range(3)],
                               kv_tokens=tokens + 64, peer_timeout_s=60.0)
        pipeline = Pipeline(specs, workdir, launcher=lambda i: net.exec_argv(i, []))
        try:
            pipeline.wait_ready(timeout_s=180)
            measured = asyncio.run(time_to_first_token(pipeline.head, tokens, repeats))
        finally:
            pipeline.stop()
        compute = [stage_prefill_s(model, b, tokens, repeats) for b in bounds]
        predicted = sum(compute) + sum(predicted_hop_s(net, k, k + 1, tokens * hidden * 4) for k in range(2))
        print(f"\n- stage prefill (1 thread, one process): {', '.join(f'{c * 1e3:.0f} ms' for c in compute)}")
        print(f"- pipeline prefill, {tokens} tokens to the first token: {measured * 1e3:.0f} ms measured "
              f"({tokens / measured:.0f} tok/s) vs {predicted * 1e3:.0f} ms predicted "
              f"({tokens / predicted:.0f} tok/s): measured / predicted {measured / predicted:.2f}")
