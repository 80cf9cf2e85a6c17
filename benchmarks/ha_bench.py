"""Losing a web process behind the load balancer: what clients see, and what the router sees.

Two web (daphne) processes of one service-mode install behind HAProxy (docker/haproxy.cfg, Debian's
haproxy on this host), the gateway on stand-in replicas (tests/observability/stand_in.py: two
replicas, a token every ``--delay-s``), four streaming and four non-streamed clients of the official
``openai`` client. The run: a steady phase, then SIGKILL of one web process, then its restart, then
a steady phase again. Printed:

- requests failed: non-streamed (goal 0) and streams (goal: only those in flight on the killed
  process), out of how many;
- the longest gap for new requests: the longest time without a successful request completing, in
  the kill's window against the steady phase's (goal under 1 s);
- dashboards: two sockets of the page's (tests/support/dashboard_watch.py), one on each process; the
  time from the killed one's drop to its first frame through the balancer again (goal under 1 s);
- the router's load per replica (``GET /api/v1/gateway/router/``: each replica's ``in_flight``,
  every process's share included, sampled every 0.1 s) with the two processes, against one process
  alone under the same clients, measured in the same run (goal within 10 %).

Needs DATABASE_URL=postgres://…, a Redis server (``--redis-db``, flushed) and haproxy on PATH.
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/ha_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.dashboard_watch import DashboardWatch, dashboard_session  # noqa: E402
from tests.support.openai_load import Load, Outcome  # noqa: E402
from tests.support.web_fleet import Balancer, Web, service_install, web_fleet, web_fleet_problem  # noqa: E402
from worker_runtime.make_demo_model import parse_args, write_demo_model  # noqa: E402


def router_load(url: str, token: str, stop: threading.Event, samples: list[dict[str, int]]) -> None:
    """Each replica's in_flight as the router sees it, every 0.1 s until ``stop``."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Token {token}"}, timeout=5) as api:
        while not stop.wait(0.1):
            try:
                replicas = api.get("/api/v1/gateway/router/").json()["models"]["demo"]["replicas"]
            except (httpx.HTTPError, KeyError, ValueError):
                continue  # the process asked was just killed: the next sample goes to another
            samples.append({rid: r["router"]["in_flight"] for rid, r in replicas.items()})


def mean_load(samples: list[dict[str, int]]) -> dict[str, float]:
    replicas = sorted({rid for s in samples for rid in s})
    return {rid: statistics.fmean(s.get(rid, 0) for s in samples) for rid in replicas}


def longest_gap(outcomes: list[Outcome], start: float, end: float) -> float:
    """The longest time within [start, end] without a successful request completing."""
    ends = sorted(o.ended for o in outcomes if o.ok and start <= o.ended <= end)
    points = [start, *ends, end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def loaded(url: str, env: dict, args, seconds: float) -> tuple[Load, list[dict[str, int]]]:
    """Run the clients against ``url`` for ``seconds`` while sampling the router; the Load, ended."""
    samples: list[dict[str, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=router_load, args=(url, env["MOTLEY_TEST_TOKEN"], stop, samples))
    with Load(f"{url}/v1", env["MOTLEY_TEST_KEY"], streams=4, plain=4, stream_tokens=args.stream_tokens,
              plain_tokens=args.plain_tokens) as load:
        sampler.start()
        time.sleep(seconds)
        stop.set()
    sampler.join()
    return load, samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--steady-s", type=float, default=6.0, help="each steady phase")
    parser.add_argument("--down-s", type=float, default=3.0, help="from the kill to the restart")
    parser.add_argument("--stream-tokens", type=int, default=40)
    parser.add_argument("--plain-tokens", type=int, default=10)
    parser.add_argument("--delay-s", type=float, default=0.05, help="the stand-in's time per token")
    parser.add_argument("--redis-db", type=int, default=6)
    args = parser.parse_args()
    if problem := web_fleet_problem():
        print(f"ha_bench: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ha-bench-") as tmp:
        workdir = Path(tmp)
        demo = workdir / "demo"
        # The stand-ins answer without running it: only its tokenizer is used, so the smallest will do.
        write_demo_model(parse_args([str(demo), "--layers", "1", "--hidden", "32", "--intermediate", "64",
                                     "--heads", "2", "--kv-heads", "1"]))
        stand_in = f"{max(args.stream_tokens, args.plain_tokens)},{args.delay_s}"
        with service_install(workdir, demo_model=demo, stand_in=stand_in, redis_db=args.redis_db) as env:
            single = Web(env, workdir / "single.log").start()
            try:
                alone = Balancer([single, single], workdir / "haproxy-single.log")
                _, single_samples = loaded(alone.url, env, args, args.steady_s)
                alone.stop()
            finally:
                single.stop()
            with web_fleet(workdir, env) as (webs, balancer):
                failover = run_failover(webs, balancer, env, args)
    kill_at, restart_at, outcomes, two_samples, dashboards = failover
    report(args, outcomes, kill_at, restart_at, single_samples, two_samples)
    recovered = [f"{seconds:.2f} s" for d in dashboards for seconds in d.recovered_within()]
    print(f"dashboards: {len(recovered)} dropped connection(s) of 2, each with a frame again after "
          f"{', '.join(recovered) or '-'} (goal < 1 s)")
    return 0


def run_failover(webs: list[Web], balancer: Balancer, env: dict, args):
    """Steady, SIGKILL of the first web process, restart on its port, steady again."""
    samples: list[dict[str, int]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=router_load,
                               args=(balancer.url, env["MOTLEY_TEST_TOKEN"], stop, samples))
    session = dashboard_session(env)
    with DashboardWatch(balancer.url, session) as one, DashboardWatch(balancer.url, session) as other, \
            Load(f"{balancer.url}/v1", env["MOTLEY_TEST_KEY"], streams=4, plain=4,
                 stream_tokens=args.stream_tokens, plain_tokens=args.plain_tokens) as load:
        sampler.start()
        time.sleep(args.steady_s)
        steady = list(samples)
        kill_at = time.monotonic()
        webs[0].kill()
        time.sleep(args.down_s)
        restart_at = time.monotonic()
        webs[0].start()
        time.sleep(args.steady_s)
        stop.set()
    sampler.join()
    return kill_at, restart_at, load.snapshot(), steady, [one, other]


def report(args, outcomes: list[Outcome], kill_at: float, restart_at: float,
           single_samples: list[dict[str, int]], two_samples: list[dict[str, int]]) -> None:
    first = min(o.started for o in outcomes)
    plain = [o for o in outcomes if not o.streamed]
    streams = [o for o in outcomes if o.streamed]
    broken = [o for o in streams if not o.ok]
    in_flight = [o for o in streams if o.started < kill_at < o.ended]
    print(f"ha_bench: 2 web processes behind HAProxy, 4 streaming + 4 non-streamed openai clients, streams "
          f"of {args.stream_tokens} and requests of {args.plain_tokens} tokens at {args.delay_s} s each")
    print(f"non-streamed failed: {sum(not o.ok for o in plain)} of {len(plain)} (goal 0)")
    print(f"streams failed: {len(broken)} of {len(streams)}; in flight at the kill (either process): "
          f"{len(in_flight)}; failed ones started after the kill: {sum(o.started > kill_at for o in broken)} "
          f"(goal 0)")
    for error in sorted({o.error[:120] for o in outcomes if not o.ok}):
        print(f"  error seen: {error}")
    steady_gap = longest_gap(outcomes, first + 1.0, kill_at)
    kill_gap = longest_gap(outcomes, kill_at, restart_at + 2.0)
    after_gap = longest_gap(outcomes, restart_at + 2.0, max(o.ended for o in outcomes))
    print(f"longest gap without a request completing: steady {steady_gap:.2f} s | kill to restart "
          f"{kill_gap:.2f} s (goal < 1 s) | after the restart {after_gap:.2f} s")
    one, two = mean_load(single_samples), mean_load(two_samples)
    print("router's in_flight per replica (mean of samples): replica | 1 process | 2 processes | ratio")
    for rid in sorted(one):
        ratio = two.get(rid, 0.0) / one[rid] if one[rid] else float("nan")
        print(f"  {rid} | {one[rid]:.2f} | {two.get(rid, 0.0):.2f} | {ratio:.3f} (goal 0.9-1.1)")
    total_one, total_two = sum(one.values()), sum(two.values())
    print(f"  all | {total_one:.2f} | {total_two:.2f} | {total_two / total_one:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
