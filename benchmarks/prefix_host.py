"""Prefix caching, part (c): the host tier on an emulated old card (``prefix_bench.py host``).

One stage holding the whole demo model on an emulated card
from the catalog (a T4: slow prefill, PCIe gen3 x16), run as a real ``worker_runtime.serve`` process
paced to the card (its prefill by the roofline, a copy back from the host tier by its PCIe figure).
A request whose long prefix was evicted from the device is timed to its first token with the host
tier (the prefix copied back) and without it (the prefix prefilled again), each against the same
request while the prefix is still on the device; per prefix token, copying back against recomputing
is set beside the planner's prediction (controlplane/planning/host_tier.py) for the same card, model
and prompt. The card runs at ``speed_factor`` = the planner's prefill efficiency
(``PREFILL_COMPUTE_EFFICIENCY``): the pacer's roofline is the card's peak, a real card's prefill
reaches the fraction the planner assumes. Prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from contracts.gpu_catalog import lookup  # noqa: E402
from contracts.hardware import GIB, DeviceSpec, FleetSpec, NodeSpec  # noqa: E402
from contracts.model_config import ModelConfig  # noqa: E402
from contracts.profiler import profile_model  # noqa: E402
from controlplane.gateway.serving.pipeline_client import PipelineClient  # noqa: E402
from controlplane.planning import PlanRequest, Workload  # noqa: E402
from controlplane.planning.cost_model import PREFILL_COMPUTE_EFFICIENCY, CostModel  # noqa: E402
from controlplane.planning.evaluate import evaluate_replica  # noqa: E402
from controlplane.planning.host_tier import HostTier, host_tier  # noqa: E402
from controlplane.planning.plan import Placement  # noqa: E402
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs, wait_healthy  # noqa: E402

BLOCK = 16  # the stage's KV block size (worker_runtime.kv_cache)


def card_spec(card: str) -> DeviceSpec:
    """The catalog card as the planner sees an emulated one."""
    model = lookup(card)
    return DeviceSpec(name="n/gpu0", node="n", index=0, model=model.name, memory_bytes=model.memory_bytes,
                      memory_bandwidth_gbs=model.memory_bandwidth_gbs, fp16_tflops=model.fp16_tflops,
                      bf16_tflops=model.bf16_tflops, int8_tops=model.int8_tops, pcie_gen=model.pcie_gen,
                      pcie_lanes=model.pcie_lanes, emulated=True)


def predicted(model: Path, device: DeviceSpec, layers: int, prefix: int, host_gib: float) -> HostTier:
    """The planner's prices for one stage of the whole model on ``device``, a prompt of ``prefix``."""
    profile = profile_model(ModelConfig.from_file(model), "demo")
    request = PlanRequest(FleetSpec("bench", (NodeSpec("n", (device,)),)), profile,
                          Workload(batch=1, context=2 * prefix, prompt_tokens=prefix), replicas=1, bits=(16,),
                          host_kv_bytes=int(host_gib * GIB))
    cost = CostModel(request)
    placements = (Placement(device.name, 0, layers, 16),)
    replica = evaluate_replica(cost, placements, 1)
    return host_tier(cost, placements, replica.predicted.prefill_ms / 1e3)


def prompt(seed: int, length: int) -> list[int]:
    return [(seed * 7919 + 31 * i) % 600 + 3 for i in range(length)]  # within the demo vocabulary


async def first_token_s(client: PipelineClient, ids: list[int]) -> float:
    started = time.perf_counter()
    async for _ in client.submit(ids, max_tokens=1):
        return time.perf_counter() - started
    raise RuntimeError("the request ended without a token")


async def measure(head: str, prefix: int, suffix: int, repeats: int) -> tuple[list[float], list[float]]:
    """Per repeat: the prefix-sharing request's time to first token with the prefix on the device, then
    (after a filler request of the prefix's length evicted it) with the prefix evicted."""
    shared = prompt(0, prefix)
    on_device, evicted = [], []
    async with PipelineClient(head, TOKEN, "bench", timeout_s=600) as client:
        await wait_healthy(client, timeout_s=120)
        await first_token_s(client, shared + prompt(1, suffix))  # the prefix's blocks, named
        for repeat in range(repeats):
            on_device.append(await first_token_s(client, shared + prompt(2 + 3 * repeat, suffix)))
            await first_token_s(client, prompt(3 + 3 * repeat, prefix + suffix))  # evicts the prefix
            evicted.append(await first_token_s(client, shared + prompt(4 + 3 * repeat, suffix)))
    return on_device, evicted


def run_pipeline(model: Path, layers: int, workdir: Path, device: DeviceSpec, args: argparse.Namespace,
                 host_kv_tokens: int) -> tuple[list[float], list[float]]:
    emulation = {"memory_bandwidth_gbs": device.memory_bandwidth_gbs, "fp16_tflops": device.fp16_tflops,
                 "time_scale": args.time_scale, "speed_factor": PREFILL_COMPUTE_EFFICIENCY,
                 "host_link_gbs": device.pcie_bandwidth_gbs}
    # Room for one prompt and its first token: the filler's blocks take the prefix's.
    kv_tokens = args.prefix + args.suffix + 2 * BLOCK
    specs = pipeline_specs(model, layers, 1, pipeline_id="bench", kv_tokens=kv_tokens, peer_timeout_s=600.0,
                           max_batch_tokens=2 * kv_tokens, emulation=emulation, host_kv_tokens=host_kv_tokens)
    pipeline = Pipeline(specs, workdir)
    try:
        pipeline.wait_ready(timeout_s=180)
        return asyncio.run(measure(pipeline.head, args.prefix, args.suffix, args.repeats))
    finally:
        pipeline.stop()


def host_tier_bench(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    model = workdir / "demo"
    subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(model), "--layers",
                    str(args.layers)], check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
    device = card_spec(args.card)
    tier = predicted(model, device, args.layers, args.prefix, args.host_gib)
    print(f"demo model: {args.layers} layers; emulated {device.model} (PCIe gen{device.pcie_gen} "
          f"x{device.pcie_lanes}, {device.pcie_bandwidth_gbs:.2f} GB/s), time scale {args.time_scale}; "
          f"prefix {args.prefix} + {args.suffix} tokens; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    if not tier.tokens:
        sys.exit(f"the planner gives {device.model} no host tier here: nothing to compare")
    copied = run_pipeline(model, args.layers, workdir, device, args, tier.tokens)
    recomputed = run_pipeline(model, args.layers, workdir, device, args, 0)
    cached = args.prefix // BLOCK * BLOCK  # whole blocks of the prefix: what a hit reuses
    scale = args.time_scale
    rows = []
    for name, (on_device, evicted) in (("host tier (copy back)", copied), ("no host tier (recompute)",
                                                                         recomputed)):
        ttft, base = statistics.median(evicted), statistics.median(on_device)
        rows.append((name, base, ttft, (ttft - base) / cached / scale))
    copy_ms, recompute_ms = rows[0][3] * 1e3, rows[1][3] * 1e3
    print(f"load average {os.getloadavg()[0]:.1f} at the end; medians of {args.repeats} runs\n")
    print("| | prefix on the device: TTFT (s) | prefix evicted: TTFT (s) "
          "| per prefix token, card time (ms) |")
    print("|---|---:|---:|---:|")
    for name, base, ttft, per_token in rows:
        print(f"| {name} | {base:.2f} | {ttft:.2f} | {per_token * 1e3:.5f} |")
    measured, planned = copy_ms / recompute_ms, tier.copy_s / tier.recompute_s
    print(f"\n- planner: copy back {tier.copy_s * 1e3:.5f} ms/token against recompute "
          f"{tier.recompute_s * 1e3:.5f} ms/token: ratio {planned:.3f}")
    print(f"- measured: ratio {measured:.3f} ({measured / planned:.2f}x the planner's); time to first token "
          f"with the tier {rows[0][2] / rows[1][2]:.2f}x without")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--card", default="T4", help="the emulated card (a catalog name)")
    parser.add_argument("--layers", type=int, default=8, help="layers of the demo model")
    parser.add_argument("--prefix", type=int, default=1024, help="tokens of the shared prefix")
    parser.add_argument("--suffix", type=int, default=32, help="tokens after it")
    parser.add_argument("--time-scale", type=float, default=2000.0,
                        help="emulation time scale: paced time must dominate the CPU's")
    parser.add_argument("--host-gib", type=float, default=4.0, help="host memory granted to the stage")
    parser.add_argument("--repeats", type=int, default=3)
