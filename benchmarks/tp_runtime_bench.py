"""A two-process tensor-parallel stage against the same stage in one process, and against the cost model.

    PYTHONPATH=. .venv/bin/python benchmarks/tp_runtime_bench.py                 # CPU, gloo (~2 min)
    PYTHONPATH=. .venv/bin/python benchmarks/tp_runtime_bench.py --device cuda   # two GPUs, NCCL

On CPU: the same stage (a middle stage of the generated demo model, layers [1, L-1), so no embedding
and no lm_head: the cost model and the runtime split the same matrices) run as two rank processes of
one torch thread each, reducing over gloo on loopback, with uneven shares (5/8 and 3/8 of the kv heads
and MLP columns), and as one process of two threads: a batch-1 prefill and the decode steps after it,
the step times side by side and rank 0's output against the one-process stage's. Then the same group
with each rank paced as an emulated card (``worker_runtime/tensor_parallel/pacing.py``: its share's
roofline x ``--time-scale``, the collectives at the real loopback's time) against what the cost model
composes (controlplane/planning/tensor_parallel.py): the slowest rank's modeled share plus two
all-reduces a layer over the link, the link's latency and bandwidth measured on the same loopback
with the same all-reduce (the alpha-beta fit of a small and a large message).

On CUDA (``--device cuda``): rank r on cuda:r over NCCL against the stage on cuda:0, unpaced; with
fewer than two CUDA devices it prints ``GPU-CHECK-SKIP: <why>`` and exits 0 (benchmarks/gpu_check.py's
``tp`` step). ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contracts.hardware import LinkSpec  # noqa: E402
from contracts.model_config import ModelConfig  # noqa: E402
from contracts.stage_spec import Emulation  # noqa: E402
from controlplane.planning.tensor_parallel import all_reduce_s  # noqa: E402
from worker_runtime import Batch, Stage  # noqa: E402
from worker_runtime.tensor_parallel import StageShard, init_group, split_shares  # noqa: E402
from worker_runtime.tensor_parallel.pacing import ShardPacer, TimedGroup  # noqa: E402

DEMO = ["--layers", "10", "--hidden", "1024", "--intermediate", "4096", "--heads", "16", "--kv-heads", "8"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def stage_range(config: ModelConfig) -> tuple[int, int]:
    """A middle stage where the model has one (no embedding, no lm_head), else the whole model."""
    return (1, config.num_layers - 1) if config.num_layers >= 3 else (0, config.num_layers)


def shares_of(config: ModelConfig, start: int, end: int, fraction: float) -> list:
    """Rank 0 holds ``fraction`` of the kv heads and MLP columns (whole heads, blocks of 64), rank 1 the
    rest."""
    kv = min(config.num_kv_heads - 1, max(1, round(fraction * config.num_kv_heads)))
    block = 64 if config.intermediate_size >= 128 else 1
    blocks = config.intermediate_size // block
    first = min(blocks - 1, max(1, round(fraction * blocks))) * block
    return split_shares(config, start, end, [kv, config.num_kv_heads - kv],
                        [first, config.intermediate_size - first])


def schedule(config: ModelConfig, start: int, prompt: int, decode: int, seq: int, dtype) -> list[Batch]:
    """A batch-1 prefill of ``prompt`` tokens, then ``decode`` steps; the same inputs for every ``seq``."""
    generator = torch.Generator().manual_seed(seq)
    batches = []
    for at, n in [(0, prompt)] + [(prompt + i, 1) for i in range(decode)]:
        if start == 0:
            ids = torch.randint(0, config.vocab_size, (n,), generator=generator)
            batches.append(Batch([seq], [at], [n], input_ids=ids))
        else:
            hidden = torch.randn(n, config.hidden_size, generator=generator).to(dtype)
            batches.append(Batch([seq], [at], [n], hidden=hidden))
    return batches


def run_steps(stage, batches: list[Batch], device: torch.device, pacer=None,
              free: bool = True) -> tuple[list[float], list]:
    """Each batch through ``stage`` (paced when ``pacer``): seconds per step, the outputs (rank 0's); the
    sequence freed after unless ``free`` is False."""
    times, outputs = [], []
    for batch in batches:
        moved = batch
        if batch.hidden is not None:
            moved = replace(batch, hidden=batch.hidden.to(device))
        elif batch.input_ids is not None:
            moved = replace(batch, input_ids=batch.input_ids.to(device))
        started = time.perf_counter()
        out = stage.forward(moved)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if pacer is not None:
            pacer.pace(batch, time.perf_counter() - started)
        times.append(time.perf_counter() - started)
        outputs.append(None if out is None else out.float().cpu())
    if free:
        stage.kv.free(batches[0].seq_ids[0])
    return times, outputs


def summarize(runs: list[list[float]]) -> dict:
    """Prefill: the best of the runs; decode: the median step over every run (ms)."""
    return {"prefill_ms": 1e3 * min(r[0] for r in runs),
            "decode_ms": 1e3 * statistics.median(t for r in runs for t in r[1:])}


def probe_link(group, hidden: int, tokens: int, dtype, device, repeats: int = 60) -> dict:
    """The group's all-reduce timed at one token's and ``tokens`` tokens' hidden states (median), and the
    alpha-beta link that fits both: ``a + B / bw``, the cost model's one-shot all-reduce of two ranks."""
    timed = {}
    for n in (1, tokens):
        x = torch.zeros(n, hidden, dtype=dtype, device=device)
        seconds = []
        for _ in range(repeats if n == 1 else max(5, repeats // 6)):
            group.broadcast(torch.zeros(1, device=device))  # start together
            started = time.perf_counter()
            group.all_reduce(x)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - started)
        timed[n * hidden * x.element_size()] = statistics.median(seconds)
    (small, t_small), (large, t_large) = sorted(timed.items())
    # Where the large message took no longer (scheduling noise over the bytes' time), the floor: all of
    # its time spent on its bytes.
    bandwidth = (large - small) / (t_large - t_small) if t_large > t_small else large / t_large
    return {"bytes": [small, large], "seconds": [t_small, t_large], "bandwidth_gbs": bandwidth / 1e9,
            "latency_us": 1e6 * max(t_small - small / bandwidth, 0.0)}


def rank_main(rank: int, args: dict, results) -> None:
    try:
        results.put((rank, rank_run(rank, args), None))
    except Exception as error:  # the parent reports it
        import traceback
        results.put((rank, None, f"{error}\n{traceback.format_exc()}"))


def rank_run(rank: int, a: dict) -> dict:
    device = torch.device(f"cuda:{rank}" if a["device"] == "cuda" else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(1)
    config, dtype = ModelConfig.from_file(a["model"]), DTYPES[a["dtype"]]
    start, end = stage_range(config)
    shares = shares_of(config, start, end, a["fraction"])
    group = TimedGroup(init_group(rank, 2, a["init"], device))
    try:
        shard = StageShard.load(a["model"], start, end, shares[rank], group, device=device, dtype=dtype,
                                kv_tokens=a["prompt"] + a["decode"] + 16)
        out = {"link": probe_link(group, config.hidden_size, a["prompt"], dtype, device)}
        runs, outputs = [], None
        for seq in range(a["repeats"]):
            batches = schedule(config, start, a["prompt"], a["decode"], seq, dtype)
            times, got = run_steps(shard, batches, device)
            runs.append(times)
            outputs = outputs or got
        out["unpaced"] = summarize(runs)
        if rank == 0:
            out["outputs"] = [outputs[0].numpy(), outputs[-1].numpy()]
        if a["time_scale"]:
            card = Emulation(a["card_gbs"], a["card_tflops"], time_scale=a["time_scale"])
            prompt, *steps = schedule(config, start, a["prompt"], a["paced_decode"], a["repeats"], dtype)
            run_steps(shard, [prompt], device, free=False)  # the context, unpaced (prefill is compute-bound)
            pacer, before = ShardPacer(shard, card), (group.seconds, group.count)
            times, _ = run_steps(shard, steps, device, pacer)
            out["paced"] = {"decode_ms": 1e3 * statistics.median(times),
                            "modeled_ms": 1e3 * statistics.median(pacer.modeled_s(b) for b in steps),
                            "collectives_ms": 1e3 * (group.seconds - before[0]) / len(steps),
                            "collectives_per_step": (group.count - before[1]) / len(steps)}
        return out
    finally:
        torch.distributed.destroy_process_group()


def one_process(a: dict) -> dict:
    """The stage in this process: the same steps at ``--threads`` torch threads (cuda:0 on CUDA)."""
    device = torch.device("cuda:0" if a["device"] == "cuda" else "cpu")
    if device.type == "cpu":
        torch.set_num_threads(a["threads"])
    config, dtype = ModelConfig.from_file(a["model"]), DTYPES[a["dtype"]]
    start, end = stage_range(config)
    stage = Stage.load(a["model"], start, end, device=device, dtype=dtype,
                       kv_tokens=a["prompt"] + a["decode"] + 16)
    runs, outputs = [], None
    for seq in range(a["repeats"]):
        times, got = run_steps(stage, schedule(config, start, a["prompt"], a["decode"], seq, dtype), device)
        runs.append(times)
        outputs = outputs or got
    return {**summarize(runs), "outputs": [outputs[0], outputs[-1]]}


def two_processes(a: dict) -> list[dict]:
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a = {**a, "init": f"tcp://127.0.0.1:{port}"}
    processes = [context.Process(target=rank_main, args=(r, a, results), daemon=True) for r in range(2)]
    for p in processes:
        p.start()
    outcomes = [None, None]
    for _ in processes:
        rank, outcome, error = results.get(timeout=600)
        if error:
            sys.exit(f"rank {rank} failed:\n{error}")
        outcomes[rank] = outcome
    for p in processes:
        p.join(timeout=30)
    return outcomes


def predicted(ranks: list[dict], link: dict, layers: int, hidden: int, element: int) -> dict:
    """The cost model's decode step for the paced group: the slowest rank's modeled share, plus two
    all-reduces of one token's hidden states a layer over the measured link."""
    spec = LinkSpec("rank0", "rank1", "pcie", link["bandwidth_gbs"], link["latency_us"])
    reduce_s = 2 * layers * float(all_reduce_s(spec, 2, hidden * element))
    slowest = max(r["paced"]["modeled_ms"] for r in ranks)
    return {"slowest_rank_ms": slowest, "all_reduce_ms": 1e3 * reduce_s, "step_ms": slowest + 1e3 * reduce_s}


def report(a: dict, single: dict, ranks: list[dict]) -> dict:
    config = ModelConfig.from_file(a["model"])
    start, end = stage_range(config)
    shares = shares_of(config, start, end, a["fraction"])
    got, want = [torch.from_numpy(o) for o in ranks[0]["outputs"]], single["outputs"]
    error = max(float((g - w).abs().max()) for g, w in zip(got, want))
    scale = max(float(w.std()) for w in want)
    link = ranks[0]["link"]
    figures = {
        "device": a["device"], "model": a["model"], "layers": [start, end], "dtype": a["dtype"],
        "shares": [{"kv_heads": s.kv_heads[1] - s.kv_heads[0],
                    "columns": s.intermediate[1] - s.intermediate[0]} for s in shares],
        "prompt": a["prompt"], "decode_steps": a["decode"], "repeats": a["repeats"],
        "one_process": {k: v for k, v in single.items() if k != "outputs"},
        "two_processes": ranks[0]["unpaced"], "link": link,
        "max_abs_error": error, "error_over_std": error / scale if scale else None,
    }
    one, two = figures["one_process"], figures["two_processes"]
    label = f"1 process x {a['threads']} threads" if a["device"] == "cpu" else "1 GPU (cuda:0)"
    group = "2 processes x 1 thread (gloo)" if a["device"] == "cpu" else "2 GPUs (NCCL)"
    print(f"\nStage [{start}, {end}) of {a['model']} ({a['dtype']}), shares (kv heads, MLP columns): "
          + ", ".join(f"{s['kv_heads']}/{s['columns']}" for s in figures["shares"]))
    print(f"\n| step | {label} (ms) | {group} (ms) | two / one |\n|---|---:|---:|---:|")
    for key, name in (("prefill_ms", f"prefill, {a['prompt']} tokens"), ("decode_ms", "decode, batch 1")):
        print(f"| {name} | {one[key]:.2f} | {two[key]:.2f} | {two[key] / one[key]:.2f}x |")
    print(f"\nRank 0's output against the one-process stage: max |diff| {error:.2e} "
          f"({figures['error_over_std']:.1e} of the outputs' std)")
    print(f"All-reduce on the group's link: {1e6 * link['seconds'][0]:.0f} us at {link['bytes'][0]} B, "
          f"{1e6 * link['seconds'][1]:.0f} us at {link['bytes'][1]} B: latency {link['latency_us']:.0f} us, "
          f"{link['bandwidth_gbs']:.2f} GB/s")
    if a["time_scale"]:
        element = torch.tensor([], dtype=DTYPES[a["dtype"]]).element_size()
        model = predicted(ranks, link, end - start, config.hidden_size, element)
        paced = ranks[0]["paced"]
        figures["paced"] = {"card": {"memory_bandwidth_gbs": a["card_gbs"], "fp16_tflops": a["card_tflops"],
                                     "time_scale": a["time_scale"]},
                            "ranks": [r["paced"] for r in ranks], "measured_ms": paced["decode_ms"],
                            "predicted": model, "ratio": paced["decode_ms"] / model["step_ms"]}
        print(f"\nPaced: each rank an emulated card of {a['card_gbs']:g} GB/s, {a['card_tflops']:g} TFLOPS, "
              f"time scale {a['time_scale']:g}; decode at batch 1 after a {a['prompt']}-token prompt\n")
        print("| | slowest rank (ms) | collectives (ms) | step (ms) |\n|---|---:|---:|---:|")
        print(f"| cost model | {model['slowest_rank_ms']:.2f} | {model['all_reduce_ms']:.2f} "
              f"(2 x {end - start} all-reduces) | {model['step_ms']:.2f} |")
        print(f"| measured | {max(r['paced']['modeled_ms'] for r in ranks):.2f} (modeled) | "
              f"{paced['collectives_ms']:.2f} ({paced['collectives_per_step']:.0f} a step, rank 0) | "
              f"{paced['decode_ms']:.2f} |")
        print(f"\nmeasured / predicted: {figures['paced']['ratio']:.3f} (goal: within 25 %)")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", help="a Hugging Face checkpoint (default: the demo model, generated)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "motley-tp-bench")
    parser.add_argument("--dtype", choices=DTYPES, help="default float32 on CPU, float16 on CUDA")
    parser.add_argument("--fraction", type=float, default=0.625, help="rank 0's share (default 5/8)")
    parser.add_argument("--threads", type=int, default=2, help="the one-process stage's torch threads")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--decode", type=int, default=24, help="decode steps after each prefill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--time-scale", type=float, default=200.0, help="paced run's scale (0: none)")
    parser.add_argument("--paced-decode", type=int, default=24)
    parser.add_argument("--card-gbs", type=float, default=320.0, help="the emulated card (default a T4's)")
    parser.add_argument("--card-tflops", type=float, default=65.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print(f"GPU-CHECK-SKIP: a two-GPU tensor-parallel step needs 2 CUDA devices, this machine has "
              f"{torch.cuda.device_count()}")
        return 0
    if args.model is None:
        args.model = str(args.work / "demo-model")
        if not (args.work / "demo-model" / "config.json").exists():
            root = str(Path(__file__).resolve().parent.parent)
            subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", args.model, *DEMO],
                           check=True, env={**os.environ, "PYTHONPATH": root})
    a = {**vars(args), "dtype": args.dtype or ("float16" if args.device == "cuda" else "float32"),
         "time_scale": args.time_scale if args.device == "cpu" else 0.0, "json": None, "work": None}
    ranks = two_processes(a)  # first, in fresh processes: this one loads its own stage after
    single = one_process(a)
    figures = report(a, single, ranks)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
