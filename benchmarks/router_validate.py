"""Check the router benchmark's simulator against real paced pipelines.

Three one-stage pipelines of the demo model run as real ``worker_runtime.serve`` processes whose
steps are paced to emulated devices of speed 1x, 0.5x and 0.25x. Each is calibrated by probing it
(one decode stream, eight together, a long prompt) into the three ``ReplicaCosts`` figures; then one
short Poisson trace is replayed on them through the gateway's router and PipelineClient, and the
same trace is simulated with the calibrated costs. Close figures mean the simulated benchmark
describes what real continuous-batching replicas do under this router.
"""

from __future__ import annotations

import asyncio
import math
import random
import tempfile
import time
from pathlib import Path

from benchmarks.replica_sim import SimReplica, simulate
from contracts.sampling import SamplingParams
from controlplane.gateway.routing import Decision, ReplicaCosts, ReplicaState, RequestShape, Router
from controlplane.gateway.serving.pipeline_client import PipelineClient, PipelineError, RequestRejected
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs
from worker_runtime.make_demo_model import parse_args, write_demo_model

SPEEDS = (("fast-1x", 1.0, 2048), ("mid-0.5x", 0.5, 1024), ("slow-0.25x", 0.25, 512))
DEADLINE_S = 30.0
STRATEGIES = ("cost_aware", "round_robin")


def emulation(speed: float) -> dict:
    """About 45 ms a decode step at 1x for the demo model (modeled time well above the CPU's own
    time, even on a busy machine); prompt tokens cost compute."""
    return {"memory_bandwidth_gbs": 0.05 * speed, "fp16_tflops": 0.0005 * speed, "time_scale": 3.0}


async def _timed(client: PipelineClient, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """(time to first token, time of the last) of one greedy request that runs to max_tokens."""
    started, first = time.monotonic(), None
    async for _ in client.submit(prompt, SamplingParams(), max_tokens=max_tokens):
        first = first or time.monotonic() - started
    return first, time.monotonic() - started


async def calibrate(client: PipelineClient) -> ReplicaCosts:
    """Probe a replica: one short decode stream, eight together, one over a long context."""
    short, long, n = [5] * 8, [5] * 400, 30
    ttft, total = await _timed(client, short, n)
    step_1 = (total - ttft) / (n - 1)
    runs = await asyncio.gather(*(_timed(client, short, n) for _ in range(8)))
    step_8 = max((total - first) / (n - 1) for first, total in runs)
    ttft_long, total_long = await _timed(client, long, n)
    step_long = (total_long - ttft_long) / (n - 1)
    kv_read = max(0.0, (step_long - step_1) / (len(long) - len(short)))
    return ReplicaCosts(
        prefill_s_per_token=max(0.0, (ttft_long - ttft) / (len(long) - len(short))),
        decode_s_per_token=max(0.0, (step_8 - step_1) / 7 - kv_read * (len(short) + n / 2)),
        decode_step_s=step_1,
        kv_read_s_per_token=kv_read,
    )


def trace(seed: int, rate: float, n: int) -> list[tuple[float, int, int]]:
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, min(300, max(4, int(rng.lognormvariate(math.log(30), 1.0)))),
                    min(150, max(2, int(rng.lognormvariate(math.log(20), 1.0))))))
    return out


async def replay(clients: dict, costs: dict, kv: dict, strategy: str, requests) -> list[dict]:
    states = [ReplicaState(name, costs[name], kv[name]) for name in clients]
    router = Router(states, strategy)
    started, results = time.monotonic(), []

    async def one(i: int, arrival: float, prompt: int, max_tokens: int) -> None:
        await asyncio.sleep(max(0.0, arrival - (time.monotonic() - started)))
        outcome = router.route(RequestShape(prompt, max_tokens), deadline_s=DEADLINE_S)
        row = {"arrival": arrival, "rejected": not isinstance(outcome, Decision)}
        results.append(row)
        if row["rejected"]:
            return
        state, rid = outcome.replica, f"v{i}"
        state.start(rid, RequestShape(prompt, max_tokens))
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(DEADLINE_S):  # as the gateway: 504 at the deadline
                async for _ in clients[state.replica_id].submit(
                    [7] * prompt, SamplingParams(), max_tokens=max_tokens, request_id=rid,
                    deadline_s=DEADLINE_S
                ):
                    row.setdefault("ttft", time.monotonic() - t0)
                    state.token(rid)
            row["e2e"] = time.monotonic() - t0
        except RequestRejected:
            row["rejected"] = True
        except (TimeoutError, PipelineError):  # counted at the deadline, as the simulator does
            row["e2e"] = DEADLINE_S
        finally:
            state.finish(rid)

    await asyncio.gather(*(one(i, *r) for i, r in enumerate(requests)))
    return results


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def figures(ttft: list[float], e2e: list[float]) -> dict:
    return {"ttft_p50": _p(ttft, 0.5), "ttft_p99": _p(ttft, 0.99), "e2e_p50": _p(e2e, 0.5),
            "e2e_p99": _p(e2e, 0.99)}


async def _run(workdir: Path, seed: int, n: int) -> dict:
    model = workdir / "demo"
    write_demo_model(parse_args([str(model), "--layers", "2", "--hidden", "64", "--intermediate", "128",
                                 "--heads", "4", "--kv-heads", "2", "--max-positions", "1024"]))
    pipelines = []
    try:
        for i, (name, speed, kv) in enumerate(SPEEDS):
            # One micro-batch: a one-stage pipeline has no other stage to overlap with (the simulator's
            # model).
            specs = pipeline_specs(
                model, 2, 1, pipeline_id=name, kv_tokens=kv, emulation=emulation(speed), micro_batches=1
            )
            (workdir / f"p{i}").mkdir()
            pipelines.append(Pipeline(specs, workdir / f"p{i}"))
        for pipeline in pipelines:
            pipeline.wait_ready()
        clients = {name: PipelineClient(p.head, TOKEN, name) for (name, _, _), p in zip(SPEEDS, pipelines)}
        for client in clients.values():
            while not (await client.health())["ok"]:
                await asyncio.sleep(0.2)
        kv = {name: k for name, _, k in SPEEDS}
        costs = {name: await calibrate(client) for name, client in clients.items()}
        sim_fleet = lambda: [SimReplica(name, costs[name], kv[name]) for name in clients]  # noqa: E731
        capacity = 0.0
        for replica in sim_fleet():
            backlog = [(0.0, p, m) for _, p, m in trace(seed + 7, 1.0, 2000)]
            replica.max_queue = len(backlog)
            done = simulate(backlog, [replica], {replica.name: costs[replica.name]}, "round_robin", 1e9,
                            bypass_router=True, until=60.0)
            capacity += sum(1 for r in done if r.done_at is not None) / 60.0
        requests = trace(seed, 0.8 * capacity, n)
        report = {"costs": {k: vars(v) for k, v in costs.items()}, "capacity_req_s": capacity,
                  "strategies": {}}
        for strategy in STRATEGIES:
            real = await replay(clients, costs, kv, strategy, requests)
            sim = simulate(requests, sim_fleet(), costs, strategy, DEADLINE_S)
            report["strategies"][strategy] = {
                "real": figures([r["ttft"] for r in real if "ttft" in r],
                                [r["e2e"] for r in real if "e2e" in r])
                | {"rejected": sum(r["rejected"] for r in real)},
                "simulated": figures(
                    [r.first_token_at - r.arrival for r in sim if r.first_token_at is not None],
                    [(r.done_at - r.arrival) if r.done_at else DEADLINE_S
                     for r in sim if r.replica and not r.rejected],
                ) | {"rejected": sum(1 for r in sim if r.rejected)},
            }
        for client in clients.values():
            await client.close()
        return report
    finally:
        for pipeline in pipelines:
            pipeline.stop()


def validate(seed: int = 0, n: int = 80) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(_run(Path(tmp), seed, n))
    print(f"validation on real paced pipelines "
          f"({n} requests at 80% of {report['capacity_req_s']:.2f} req/s):")
    for name, c in report["costs"].items():
        print(f"  {name}: calibrated " + ", ".join(f"{k}={v * 1000:.2f} ms" for k, v in c.items()))
    print("  | strategy | run | TTFT p50 s | TTFT p99 s | e2e p50 s | e2e p99 s | rejected |")
    for strategy, runs in report["strategies"].items():
        for kind, m in runs.items():
            print(f"  | {strategy} | {kind} | {m['ttft_p50']:.2f} | {m['ttft_p99']:.2f} | {m['e2e_p50']:.2f} "
                  f"| {m['e2e_p99']:.2f} | {m['rejected']} |")
    return report
