"""``python -m controlplane.planning plan ...``: plan from a fleet file and a config.json, no database.

Exit status 0 with the plan on stdout; 2 with the reason on stderr when the request is infeasible
or an input cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from contracts.fleet_file import FleetFileError, load_fleet_file
from contracts.hardware import GIB
from contracts.model_config import ModelConfig, UnsupportedModelError
from contracts.profiler import profile_model
from controlplane.planning.baselines import baseline_plan
from controlplane.planning.plan import Plan
from controlplane.planning.planner import plan
from controlplane.planning.request import Pin, PlanningError, PlanRequest, Workload
from controlplane.planning.serialize import plan_to_dict


def _bits(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(b) for b in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bits like 16,8,4, got {text!r}") from None


def _replicas(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _pin(text: str) -> Pin:
    """``node-a/gpu0:0-10`` -> the device holds layers [0, 10)."""
    try:
        device, span = text.rsplit(":", 1)
        start, end = (int(x) for x in span.split("-"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected DEVICE:START-END like node-a/gpu0:0-10, got {text!r}") from None
    return Pin(device, start, end)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="python -m controlplane.planning", description=__doc__)
    commands = root.add_subparsers(dest="command", required=True)
    p = commands.add_parser("plan", help="plan a deployment and print it")
    p.add_argument("--fleet", required=True, help="fleet file (YAML or JSON)")
    p.add_argument("--model", required=True, help="Hugging Face config.json or the directory holding it")
    p.add_argument("--batch", type=int, default=8, help="concurrent sequences per replica")
    p.add_argument("--context", type=int, default=4096,
                   help="tokens (prompt + output) each sequence may hold")
    p.add_argument("--prompt", type=int, default=None, help="typical prompt length (default: context / 2)")
    p.add_argument("--objective", choices=("throughput", "latency"), default="throughput")
    p.add_argument("--bits", type=_bits, default=(16, 8, 4), help="allowed precisions, e.g. 16,8")
    p.add_argument("--max-quantized", type=float, default=0.5, help="largest share of layers below 16 bits")
    p.add_argument("--max-kl", type=float, help="measured quality budget: summed KL of the low-bit layers "
                   "(needs the profile's sensitivity, from manage.py profile_quality)")
    p.add_argument("--replicas", type=_replicas, default="auto", help="a number or 'auto'")
    p.add_argument("--exclude-node", action="append", default=[], help="never use this node (repeatable)")
    p.add_argument("--exclude-device", action="append", default=[], help="never use this device (repeatable)")
    p.add_argument("--pin", type=_pin, action="append", default=[],
                   help="DEVICE:START-END, the device holds layers [START, END) (repeatable)")
    p.add_argument("--host-kv-gib", type=float, default=0.0,
                   help="host memory per stage for KV blocks evicted from the device (the host tier)")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="search tensor-parallel groups of one node's cards jointly with the pipeline")
    p.add_argument("--baseline", choices=("even", "memory"), help="print a baseline split instead")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (docs/planner.md)")
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        fleet = load_fleet_file(args.fleet)
        config = ModelConfig.from_file(args.model)
        model_path = Path(args.model)
        name = (model_path if model_path.is_dir() else model_path.parent).name
        request = PlanRequest(
            fleet=fleet, model=profile_model(config, name),
            workload=Workload(batch=args.batch, context=args.context, prompt_tokens=args.prompt),
            objective=args.objective, bits=args.bits, max_quantized=args.max_quantized, max_kl=args.max_kl,
            replicas=args.replicas, exclude_nodes=tuple(args.exclude_node),
            exclude_devices=tuple(args.exclude_device), pins=tuple(args.pin),
            host_kv_bytes=int(args.host_kv_gib * GIB), tensor_parallel=args.tensor_parallel,
        )
        result = baseline_plan(request, args.baseline) if args.baseline else plan(request)
    except (PlanningError, FleetFileError, UnsupportedModelError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan_to_dict(result), indent=2) if args.json else render(result))
    return 0


def render(result: Plan) -> str:
    """A short human-readable table of the plan, then its explanation."""
    lines = [f"{result.kind} plan of {result.model} on {result.fleet}: "
             f"{result.predicted.decode_tokens_per_s:.0f} tokens/s, "
             f"{result.predicted.token_latency_ms:.2f} ms "
             f"between tokens, prefill {result.predicted.prefill_ms:.0f} ms"]
    for index, replica in enumerate(result.replicas):
        lines.append(f"replica {index} ({replica.micro_batches} micro-batches of "
                     f"{replica.micro_batch_size}):")
        for s in replica.stages:
            lines.append(f"  {s.device:<16} {s.gpu_model:<16} layers [{s.start:>3}, {s.end:>3}) "
                         f"{s.bits:>2}-bit kv {s.kv_tokens:>9} step {s.step_ms:8.3f} ms  "
                         f"mem {s.memory.total_bytes / 2**30:6.1f}"
                         f"/{s.memory.capacity_bytes / 2**30:.1f} GiB")
            lines.extend(f"    rank {r.device:<16} {r.kv_heads:>3} kv heads {r.columns:>6} MLP columns "
                         f"{r.bits:>2}-bit" for r in s.group)
    lines.extend(f"- {line}" for line in result.explanation)
    return "\n".join(lines)
