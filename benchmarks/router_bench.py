"""Router benchmark: cost-aware routing against least-outstanding-tokens and round-robin on a fleet
of replicas of clearly different speed (1x, 0.5x, 0.25x; the slower ones also have less KV space,
as older GPUs do); and the throttle scenario: the fast replica runs at half speed for the middle
half of the run, routed by the cost-aware router fed by telemetry (benchmarks/replica_sim.py's
LiveFeed through routing.signals, as the gateway's live_health.py does), by the same router blind to
telemetry, and by round-robin, on the same trace.

    python benchmarks/router_bench.py [--duration 600] [--seed 0] [--scenario all|matrix|throttle]
        [--validate]

Replicas are SIMULATED (benchmarks/replica_sim.py: a discrete-event model of continuous-batching
pipeline heads) and routed by the gateway's real router code. The trace has Poisson arrivals and
long-tailed (log-normal) prompt and output lengths; each load level is a share of the fleet's total
capacity, measured by saturating each simulated replica alone. ``--validate`` also replays a short
trace on real paced pipelines (worker_runtime.serve with emulation pacing) and compares what the
simulator predicts for it with what they measured.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.replica_sim import LiveFeed, SimReplica, SimRequest, simulate  # noqa: E402
from contracts.routing import ROUTING_STRATEGIES  # noqa: E402
from controlplane.gateway.routing import PREFIX_BLIND, ReplicaCosts  # noqa: E402

# The 1x replica: a 7B-class model on a fast GPU (20 ms decode step, 0.2 ms per extra sequence,
# 0.25 µs per cached token read (0.5 MB of fp16 KV per token at 2 TB/s), 0.15 ms per prompt token)
# with room for 40k KV tokens; the others are slower and smaller.
BASE = ReplicaCosts(
    prefill_s_per_token=0.00015, decode_s_per_token=0.0002, decode_step_s=0.020, kv_read_s_per_token=2.5e-7
)
FLEET = [("fast-1x", 1.0, 40_000), ("mid-0.5x", 0.5, 20_000), ("slow-0.25x", 0.25, 10_000)]
LOADS = (0.5, 0.8, 0.95)
DEADLINE_S = 120.0
# The throttle scenario: FLEET's fast replica at half speed from 1/4 to 3/4 of the run; two output-length
# tails (log-normal sigma): the matrix's heavy one and a chat-like one.
THROTTLED, THROTTLE_SPEED, THROTTLE_WINDOW = "fast-1x", 0.5, (0.25, 0.75)
THROTTLE_LOADS = (0.5, 0.7)
OUTPUT_SIGMAS = {"chat": 0.5, "heavy": 1.0}
THROTTLE_RUNS = (("telemetry-fed", "cost_aware", True), ("blind", "cost_aware", False),
                 ("round-robin", "round_robin", False))


def make_fleet(fleet=FLEET, base=BASE) -> list[SimReplica]:
    return [SimReplica(name, base.scaled(1 / speed), kv) for name, speed, kv in fleet]


def lengths(rng: random.Random, n: int, output_sigma: float = 1.0) -> list[tuple[int, int]]:
    """Long-tailed prompt and output lengths: log-normal, medians 200 and 120 tokens."""
    return [
        (min(4000, max(8, int(rng.lognormvariate(math.log(200), 1.0)))),
         min(1500, max(4, int(rng.lognormvariate(math.log(120), output_sigma)))))
        for _ in range(n)
    ]


def poisson_trace(
    rng: random.Random, rate: float, duration: float, output_sigma: float = 1.0
) -> list[tuple[float, int, int]]:
    times, t = [], rng.expovariate(rate)
    while t < duration:
        times.append(t)
        t += rng.expovariate(rate)
    return [(t, p, m) for t, (p, m) in zip(times, lengths(rng, len(times), output_sigma))]


def capacity(replica_factory, seed: int, window_s: float = 300.0, output_sigma: float = 1.0) -> float:
    """Requests per second one replica completes with an endless backlog of trace requests."""
    replica = replica_factory()
    backlog = [(0.0, p, m) for p, m in lengths(random.Random(seed), 20_000, output_sigma)]
    replica.max_queue = len(backlog)
    done = simulate(
        backlog, [replica], {replica.name: replica.costs}, "round_robin", 1e9, bypass_router=True,
        until=window_s
    )
    return sum(1 for r in done if r.done_at is not None and r.done_at <= window_s) / window_s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarize(requests: list[SimRequest], duration: float, replicas: list[SimReplica]) -> dict:
    served = [r for r in requests if r.done_at is not None]
    admitted = [r for r in requests if r.replica is not None]
    # A request cut at its deadline counts with the deadline as its latency (a lower bound).
    ttft = [min(r.first_token_at or math.inf, r.arrival + DEADLINE_S) - r.arrival for r in admitted]
    e2e = [r.done_at - r.arrival if r.done_at is not None else DEADLINE_S for r in admitted]
    return {
        "ttft_p50": percentile(ttft, 0.5), "ttft_p99": percentile(ttft, 0.99),
        "e2e_p50": percentile(e2e, 0.5), "e2e_p99": percentile(e2e, 0.99),
        "throughput_tok_s": sum(r.max_tokens for r in served) / max(r.done_at for r in served),
        "requests": len(requests),
        "rejected": sum(1 for r in requests if r.rejected),
        "timed_out": sum(1 for r in requests if r.timed_out),
        "waited_for_kv": sum(1 for r in requests if r.waited_for_kv),
        "kv_overflow": sum(1 for rep in replicas if rep.peak_kv > rep.kv_capacity),
        "share": {rep.name: sum(1 for r in served if r.replica == rep.name) / max(1, len(served))
                  for rep in replicas},
    }


def run_matrix(duration: float, seed: int) -> dict:
    total = sum(capacity(lambda f=f: make_fleet([f])[0], seed) for f in FLEET)
    results = {"total_capacity_req_s": total, "duration_s": duration, "loads": {}}
    for load in LOADS:
        trace = poisson_trace(random.Random(seed + 1), load * total, duration)
        results["loads"][load] = {}
        for strategy in ROUTING_STRATEGIES:
            if strategy in PREFIX_BLIND:  # no prompt here has a prefix to be blind to: cost_aware's run
                continue
            fleet = make_fleet()
            requests = simulate(trace, fleet, {r.name: r.costs for r in fleet}, strategy, DEADLINE_S)
            results["loads"][load][strategy] = summarize(requests, duration, fleet)
    return results


def _table_head(head: str) -> list[str]:
    """A Markdown table's first lines: ``head`` ("| a | b |") and the line under it."""
    return [head, "|" + " --- |" * (head.count("|") - 1)]


def _percentages(shares: dict[str, float]) -> str:
    return "/".join(f"{v:.0%}" for v in shares.values())


def table(results: dict) -> str:
    head = ("| load | strategy | TTFT p50 s | TTFT p99 s | e2e p50 s | e2e p99 s | tokens/s | rejected | "
            "504 | e2e p99 vs RR | share fast/mid/slow |")
    lines = _table_head(head)
    for load, by_strategy in results["loads"].items():
        rr = by_strategy["round_robin"]["e2e_p99"]
        for strategy, m in by_strategy.items():
            share = _percentages(m["share"])
            lines.append(
                f"| {float(load):.0%} | {strategy} | {m['ttft_p50']:.2f} | {m['ttft_p99']:.2f} | "
                f"{m['e2e_p50']:.1f} | {m['e2e_p99']:.1f} | {m['throughput_tok_s']:.0f} | "
                f"{m['rejected']}/{m['requests']} | {m['timed_out']} | {m['e2e_p99'] / rr:.2f} | {share} |"
            )
    return "\n".join(lines)


def run_throttle(duration: float, seed: int, tails=tuple(OUTPUT_SIGMAS), loads=THROTTLE_LOADS) -> dict:
    """The throttle scenario: each tail, load and router on the same trace; the throttled replica's
    share of the requests that arrived before, during and after its throttling."""
    start, end = (duration * f for f in THROTTLE_WINDOW)
    results = {"window_s": [start, end], "tails": {}}
    for tail in tails:
        sigma = OUTPUT_SIGMAS[tail]
        total = sum(capacity(lambda f=f: make_fleet([f])[0], seed, output_sigma=sigma) for f in FLEET)
        results["tails"][tail] = {"capacity_req_s": total, "loads": {}}
        for load in loads:
            trace = poisson_trace(random.Random(seed + 1), load * total, duration, sigma)
            runs = results["tails"][tail]["loads"][load] = {}
            for label, strategy, live in THROTTLE_RUNS:
                fleet = make_fleet()
                for replica in fleet:
                    if replica.name == THROTTLED:
                        replica.speed = lambda now: THROTTLE_SPEED if start <= now < end else 1.0
                requests = simulate(trace, fleet, {r.name: r.costs for r in fleet}, strategy, DEADLINE_S,
                                    live=LiveFeed() if live else None)
                summary = summarize(requests, duration, fleet)
                phases = {"before": (0, start), "during": (start, end), "after": (end, duration)}
                summary["throttled_share"] = {
                    phase: sum(1 for r in requests if a <= r.arrival < b and r.replica == THROTTLED)
                    / max(1, sum(1 for r in requests if a <= r.arrival < b and r.replica))
                    for phase, (a, b) in phases.items()
                }
                runs[label] = summary
    return results


def throttle_table(results: dict) -> str:
    head = ("| outputs | load | router | TTFT p99 s | e2e p50 s | e2e p99 s | 429 | 504 | throttled "
            "replica's share before/during/after | e2e p99 vs blind | vs round-robin |")
    lines = _table_head(head)
    for tail, by_tail in results["tails"].items():
        for load, runs in by_tail["loads"].items():
            blind, rr = runs["blind"]["e2e_p99"], runs["round-robin"]["e2e_p99"]
            for label, m in runs.items():
                share = _percentages(m["throttled_share"])
                lines.append(
                    f"| {tail} | {float(load):.0%} | {label} | {m['ttft_p99']:.2f} | {m['e2e_p50']:.1f} | "
                    f"{m['e2e_p99']:.1f} | {m['rejected']} | {m['timed_out']} | {share} | "
                    f"{m['e2e_p99'] / blind:.2f} | {m['e2e_p99'] / rr:.2f} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="simulated seconds of arrivals per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--validate", action="store_true",
                        help="replay a short trace on real paced pipelines")
    parser.add_argument("--scenario", choices=("all", "matrix", "throttle"), default="all")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = {}
    print(f"fleet: {', '.join(f'{n} ({s}x, {kv} KV tokens)' for n, s, kv in FLEET)}; "
          f"{args.duration:.0f} s of arrivals per run; deadline {DEADLINE_S:.0f} s (simulated replicas)")
    if args.scenario in ("all", "matrix"):
        results = run_matrix(args.duration, args.seed)
        print(f"capacity {results['total_capacity_req_s']:.2f} req/s")
        print(table(results))
        for load, by_strategy in results["loads"].items():
            ratio = by_strategy["cost_aware"]["e2e_p99"] / by_strategy["round_robin"]["e2e_p99"]
            overflow = sum(m["kv_overflow"] for m in by_strategy.values())
            print(f"load {float(load):.0%}: cost-aware e2e p99 / round-robin = {ratio:.2f}; "
                  f"KV overflows: {overflow}")
    if args.scenario in ("all", "throttle"):
        results["throttle"] = run_throttle(args.duration, args.seed)
        window = "–".join(f"{t:.0f}" for t in results["throttle"]["window_s"])
        print(f"\nthrottle: {THROTTLED} at {THROTTLE_SPEED:g}x speed from {window} s")
        print(throttle_table(results["throttle"]))
    if args.validate:
        from benchmarks.router_validate import validate

        results["validation"] = validate(seed=args.seed)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    print(f"done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
