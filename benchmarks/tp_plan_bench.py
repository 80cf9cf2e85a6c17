"""Tensor-parallel planner benchmark: predicted batch-1 token latency of the best joint plan (pipeline
stages and tensor-parallel groups, ``PlanRequest.tensor_parallel``) against the best pipeline-only
plan, and the batch-16 throughput of each, on catalog fleets whose unequal cards share NVLink or a
PCIe switch, and on two cards behind slow risers where groups do not pay.

    .venv/bin/python benchmarks/tp_plan_bench.py

Each fleet is one node built from contracts/gpu_catalog.py entries (no figure overridden; the slow
case declares its riser link, and the A10, which has no NVLink in the catalog, a
100 GB/s bridge to the A100). Context 4096 tokens, default quality budget (half the layers may go
below 16 bits), one replica. Figures are the planner's predictions, not measurements.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402
from pathlib import Path  # noqa: E402

from contracts.fleet_file import parse_fleet  # noqa: E402
from contracts.model_config import ModelConfig  # noqa: E402
from contracts.profiler import profile_model  # noqa: E402
from controlplane.planning import PlanRequest, Workload, plan  # noqa: E402

MODELS = Path(__file__).resolve().parent.parent / "examples" / "models"


def node(name: str, gpus: list[dict], links: list[dict] | None = None) -> dict:
    return {"name": name, "nodes": [{"name": "n0", "network_gbps": 100, "gpus": gpus}], "links": links or []}


FLEETS = [
    ("A100-80GB + A10, declared NVLink (100 GB/s)", node(
        "a100-a10-nvlink", [{"model": "A100-80GB-SXM"}, {"model": "A10"}],
        [{"between": ["n0/gpu0", "n0/gpu1"], "kind": "nvlink", "bandwidth_gbs": 100}]), "Llama-2-13B"),
    ("RTX 4090 + RTX 3090, PCIe 4", node("4090-3090-pcie", [{"model": "RTX-4090"}, {"model": "RTX-3090"}]),
     "Llama-3-8B"),
    ("four mixed cards, NVLink", node("four-mixed-nvlink", [
        {"model": "A100-80GB-SXM", "nvlink": True}, {"model": "A100-40GB-SXM", "nvlink": True},
        {"model": "V100-32GB", "nvlink": True}, {"model": "V100-16GB", "nvlink": True}]), "Llama-2-70B"),
    ("four mixed cards, PCIe 4", node("four-mixed-pcie", [
        {"model": "RTX-4090"}, {"model": "RTX-3090"}, {"model": "A10"}, {"model": "L4"}]), "Llama-2-13B"),
    ("RTX 3090 x2 on x1 risers (1 GB/s, 50 us)", node(
        "3090-risers", [{"model": "RTX-3090"}, {"model": "RTX-3090"}],
        [{"between": ["n0/gpu0", "n0/gpu1"], "kind": "pcie", "bandwidth_gbs": 0.985, "latency_us": 50}]),
     "Llama-3-8B"),
]


def best(fleet, model, batch: int, objective: str, joint: bool):
    request = PlanRequest(fleet=fleet, model=model, workload=Workload(batch=batch, context=4096),
                          objective=objective, replicas=1, tensor_parallel=joint)
    started = time.perf_counter()
    result = plan(request)
    return result, time.perf_counter() - started


def shape(result) -> str:
    return " | ".join(f"{f'TP{len(s.group)}' if s.group else s.gpu_model} [{s.start},{s.end}) {s.bits_label}"
                      for s in result.replicas[0].stages)


def main() -> None:
    print("| fleet | model | batch-1 ms/token: pipeline-only | joint | speed-up | joint plan | "
          "batch-16 tokens/s: pipeline-only | joint | joint plan (batch 16) | planning s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, data, model_name in FLEETS:
        fleet = parse_fleet(data, label)
        model = profile_model(ModelConfig.from_file(MODELS / model_name), model_name)
        alone1, _ = best(fleet, model, 1, "latency", False)
        joint1, seconds = best(fleet, model, 1, "latency", True)
        alone16, _ = best(fleet, model, 16, "throughput", False)
        joint16, seconds16 = best(fleet, model, 16, "throughput", True)
        a, j = alone1.predicted.token_latency_ms, joint1.predicted.token_latency_ms
        print(f"| {label} | {model_name} | {a:.2f} | {j:.2f} | {a / j:.2f}x | {shape(joint1)} | "
              f"{alone16.predicted.decode_tokens_per_s:.0f} | {joint16.predicted.decode_tokens_per_s:.0f} | "
              f"{shape(joint16)} | {seconds + seconds16:.2f} |")


if __name__ == "__main__":
    main()
