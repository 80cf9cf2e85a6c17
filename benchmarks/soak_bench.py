"""Soak: a bounded run at 70 % of measured capacity through the gateway; does anything grow?

    python benchmarks/soak_bench.py [--minutes 20] [--work /tmp/soak] [--redis-db 5] [--json F]

The system of ``chaos_bench.py`` (service mode: PostgreSQL, Redis, the ASGI server, Celery worker and beat
as processes of their own, agents on an emulated fleet, the generated demo model on three of four nodes).
Capacity first: clients sending back to back, 1, 2, 4, 8, … for ``--ramp-s`` each, until the throughput
grows by less than 10 % or requests fail (past one key's concurrent requests limit, 16 by default, they
are refused); the best step without failures is the capacity. Then ``--minutes`` at 70 % of it (the best
step's clients, each pacing its requests). Printed per minute: requests, error rate, p50/p99. At the start
of the steady run and at its end: the RSS and open file descriptors of every process (control plane,
agents, stages; psutil), the database's size (``pg_database_size``) and the broker's (Redis ``DBSIZE`` of
its db and the server's ``used_memory``). Goal: each flat within 10 %. Not in CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chaos_bench import (  # noqa: E402
    SupervisedSystem,
    deploy,
    emit,
    layer_count,
    model_path,
    service_arguments,
    service_env,
)
from benchmarks.steady_clients import SteadyClients  # noqa: E402
from tests.support.processes import REPO_ROOT  # noqa: E402

DB_SIZE = ("from django.db import connection; c = connection.cursor();"
           "c.execute('SELECT pg_database_size(current_database())'); print(c.fetchone()[0])")


def capacity(system: SupervisedSystem, key: str, ramp_s: float) -> tuple[float, int, list[dict]]:
    """Requests per second with clients back to back, ramped until throughput stops growing."""
    steps: list[dict] = []
    count = 1
    while count <= 32:
        clients = SteadyClients(base_url=system.url, api_key=key, model="chaos", clients=count).start()
        time.sleep(2)  # warm: every client has a request in flight
        start = time.monotonic()
        time.sleep(ramp_s)
        window = clients.window(start, time.monotonic())
        clients.stop()
        steps.append({"clients": count, "rps": round(window.ok / ramp_s, 2), "failed": window.failed,
                      "p99_s": window.p99_s, "errors": sorted({e[:200] for e in window.errors})[:3]})
        print(f"ramp: {steps[-1]}", flush=True)
        if window.failed or (len(steps) > 1 and steps[-1]["rps"] < steps[-2]["rps"] * 1.1):
            break  # refusals (one key's 16 requests in flight at most: docs/gateway.md) or no gain
        count *= 2
    best = max((s for s in steps if not s["failed"]), key=lambda s: s["rps"])
    return best["rps"], best["clients"], steps


def resources(system: SupervisedSystem) -> dict[str, dict]:
    """RSS (MiB) and open fds of each process of the system, stage processes named by their folder."""
    found: dict[str, dict] = {}
    for name, popen in system.processes.items():
        try:
            root = psutil.Process(popen.pid)
            for process in [root, *root.children(recursive=True)]:
                label = name if process is root else f"{name}/{Path(process.cwd()).name}/{process.pid}"
                found[label] = {"rss_mib": round(process.memory_info().rss / 2**20, 1),
                                "fds": process.num_fds()}
        except psutil.Error:
            continue
    return found


def sizes(system: SupervisedSystem) -> dict:
    import redis

    broker = redis.Redis.from_url(system.env["CELERY_BROKER_URL"])
    return {"database_bytes": int(system.manage("shell", "-c", DB_SIZE).strip().splitlines()[-1]),
            "broker_keys": broker.dbsize(), "redis_used_memory": broker.info("memory")["used_memory"]}


def growth(start: dict[str, dict], end: dict[str, dict]) -> list[dict]:
    """Per process present at both ends: start, end and the change in %, RSS and fds."""
    rows = []
    for label in sorted(start.keys() & end.keys()):
        a, b = start[label], end[label]
        rows.append({"process": label, **{f"{k}_start": a[k] for k in a}, **{f"{k}_end": b[k] for k in b},
                     "rss_change_pct": round(100 * (b["rss_mib"] / a["rss_mib"] - 1), 1),
                     "fds_change_pct": round(100 * (b["fds"] / a["fds"] - 1), 1)})
    return rows


def soak(args: argparse.Namespace) -> dict:
    args.work.mkdir(parents=True, exist_ok=True)
    with service_env(args.work, args.database_url, args.redis_db) as env:
        system = SupervisedSystem(workdir=args.work, env=env)
        try:
            system.start()
            path = model_path(system, "generated", args.work / "model")
            pk, key = deploy(system, path, layer_count(path))
            rps, count, ramp = capacity(system, key, args.ramp_s)
            rate = 0.7 * rps
            clients = SteadyClients(base_url=system.url, api_key=key, model="chaos", clients=count,
                                    interval_s=count / rate).start()
            time.sleep(10)  # warm at the soak's pace before the first sample
            begin, first, first_sizes = time.monotonic(), resources(system), sizes(system)
            minutes = []
            for minute in range(args.minutes):
                time.sleep(max(0.0, begin + 60 * (minute + 1) - time.monotonic()))
                w = clients.window(begin + 60 * minute, begin + 60 * (minute + 1))
                minutes.append({"minute": minute + 1, "ok": w.ok, "failed": w.failed,
                                "error_rate": round(w.failed / max(1, w.ok + w.failed), 4),
                                "p50_s": w.p50_s, "p99_s": w.p99_s})
                print(f"minute {minute + 1}: {w.line()}", flush=True)
            last, last_sizes = resources(system), sizes(system)
            clients.stop()
            return {"capacity_rps": rps, "ramp": ramp, "soak_rps": round(rate, 2), "clients": count,
                    "minutes": minutes, "processes": growth(first, last), "sizes": [first_sizes, last_sizes],
                    "restarts": system.restarts, "load": os.getloadavg()}
        finally:
            system.stop()


def report(result: dict) -> None:
    print(f"\ncapacity {result['capacity_rps']} req/s; soak at {result['soak_rps']} req/s "
          f"({result['clients']} clients)\n\n| minute | ok | failed | error rate | p50 | p99 |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in result["minutes"]:
        print(f"| {m['minute']} | {m['ok']} | {m['failed']} | {m['error_rate']:.2%} "
              f"| {m['p50_s'] or 0:.2f} s | {m['p99_s'] or 0:.2f} s |")
    print("\n| process | RSS start | RSS end | change | fds start | fds end | change |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for p in result["processes"]:
        print(f"| {p['process']} | {p['rss_mib_start']} MiB | {p['rss_mib_end']} MiB "
              f"| {p['rss_change_pct']:+.1f} % | {p['fds_start']} | {p['fds_end']} "
              f"| {p['fds_change_pct']:+.1f} % |")
    start, end = result["sizes"]
    print(f"\ndatabase {start['database_bytes']} -> {end['database_bytes']} bytes; broker keys "
          f"{start['broker_keys']} -> {end['broker_keys']}; Redis used_memory "
          f"{start['redis_used_memory']} -> {end['redis_used_memory']}; restarts {result['restarts']}; "
          f"load average {result['load']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=20)
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "var" / "bench" / "soak")
    service_arguments(parser)
    parser.add_argument("--ramp-s", type=float, default=15.0, help="seconds per step of the capacity ramp")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    emit(soak(args), report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
