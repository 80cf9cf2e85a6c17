"""Telemetry benchmark: agents' heartbeats to dashboard browsers through the real ASGI server, the
dashboard socket's deltas side by side with full snapshots in one run.

    .venv/bin/python benchmarks/telemetry_bench.py [--gpus 10000] [--gpus-per-node 8]
        [--dashboards 50] [--probes 5] [--modes full delta] [--duration 20] [--warmup 10]
        [--agent-processes 2] [--dashboard-processes 2] [--markdown]

Starts daphne serving ``controlplane.asgi`` on a fresh embedded install (SQLite, in-memory channel
layer), registers ``gpus / gpus-per-node`` nodes with real join tokens, then runs, in processes of
their own (``telemetry_sim.py``), one websocket per simulated agent on ``/ws/agents/`` sending a
contracts §3 heartbeat every second, and, one mode after the other on the same server and agents,
``dashboards`` logged-in browser sockets on ``/ws/dashboard/`` subscribed to every node, with full
snapshots on every tick (``"deltas": false``) or a snapshot then deltas, acknowledging every frame as
the dashboard's JS does.

Latency is agent-to-browser, measured on the probe sockets (which parse and apply every frame): for
every GPU sample, the time from the agent's ``sent_at`` to the first frame carrying it (same machine,
same clock), split into agent's send to frame rendered (the frame's ``at``) and rendered to arrived
(every socket). CPU is the server process's user+system time over the measured window, in cores, and
per heartbeat ingested (one node's update: 8 GPU samples), counted by the hub's version, which the
frames carry: a server behind its agents ingests fewer heartbeats than they send.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import telemetry_sim  # noqa: E402

SPAWN = multiprocessing.get_context("spawn")  # the load's processes start clean, without Django


def setup_install(var_dir: Path, nodes: int, gpus_per_node: int) -> tuple[list[dict], str]:
    """Migrate a fresh install, register the nodes as agents would, and log a browser user in."""
    os.environ["MOTLEY_VAR_DIR"] = str(var_dir)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from controlplane.enrollment.services import agent_register, join_token_create

    call_command("migrate", verbosity=0, interactive=False)
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    device = {"model": "A100-80GB-SXM", "memory_bytes": 80 * 2**30, "memory_bandwidth_gbs": 2039.0,
              "fp16_tflops": 312.0, "bf16_tflops": 312.0, "int8_tops": 624.0}
    agents = []
    for n in range(nodes):
        registration = agent_register(join_token=secret, name=f"bench-{n:04d}", address="127.0.0.1",
                                      emulated=True,
                                      devices=[{**device, "index": i} for i in range(gpus_per_node)])
        agents.append({"node_id": registration.node.pk, "credential": registration.credential,
                       "incarnation": registration.incarnation})
    user = get_user_model().objects.create_user(username="bench", password="bench-password")
    client = Client()
    client.force_login(user)
    return agents, client.cookies["sessionid"].value


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _spawn(target, *args) -> tuple:
    """Run ``target(conn, *args)`` in a fresh process; it reports as JSON on ``conn`` (both ways)."""
    ours, theirs = SPAWN.Pipe()
    process = SPAWN.Process(target=target, args=(theirs, *args), daemon=True)
    process.start()
    return process, ours


def _collect(process, conn, timeout_s: float) -> dict:
    if not conn.poll(timeout_s):
        process.kill()
        raise TimeoutError(f"{process.name} sent no report within {timeout_s:.0f}s")
    report = json.loads(conn.recv_bytes())
    process.join(timeout=10)
    if report["failed"]:
        raise RuntimeError(f"{report['failed']} sockets failed in {process.name}, "
                           f"first: {report['errors'][0]}")
    return report


def _shares(items: list, parts: int) -> list[list]:
    return [items[i::parts] for i in range(parts)]


def measure(port: int, agents: list[dict], session: str, args, server: psutil.Process) -> list[dict]:
    """Each mode's dashboards in turn against the same server and agents; one result per mode."""
    base, origin = f"ws://127.0.0.1:{port}", f"http://127.0.0.1:{port}"
    agent_runs = [_spawn(telemetry_sim.run_agents, f"{base}/ws/agents/", share, args.gpus_per_node)
                  for share in _shares(agents, args.agent_processes)]
    for process, conn in agent_runs:  # every agent's socket open before anything is measured
        report = json.loads(conn.recv_bytes()) if conn.poll(600) else {"ready": False, "errors": ["timeout"]}
        if not report["ready"]:
            raise RuntimeError(f"the agents of {process.name} could not all connect: {report['errors']}")
    asyncio.run(telemetry_sim.fleet_heard(f"{base}/ws/dashboard/", origin, session, len(agents), 600))
    phase = args.warmup + args.duration + 2
    t0 = time.time() + 2
    windows = [[t0 + i * phase + args.warmup, t0 + i * phase + args.warmup + args.duration]
               for i in range(len(args.modes))]
    until = t0 + len(args.modes) * phase
    for _, conn in agent_runs:
        conn.send_bytes(json.dumps({"until": until}).encode())
    results = []
    for i, mode in enumerate(args.modes):
        start, end = windows[i]
        per_process = _shares(list(range(args.dashboards)), args.dashboard_processes)
        probes = _shares(list(range(args.probes)), args.dashboard_processes)
        runs = [_spawn(telemetry_sim.run_dashboards, f"{base}/ws/dashboard/", origin, session,
                       mode == "delta", len(share), len(probe), start, end)
                for share, probe in zip(per_process, probes, strict=True)]
        time.sleep(max(0.0, start - time.time()))
        cpu, wall = sum(server.cpu_times()[:2]), time.monotonic()
        time.sleep(max(0.0, end - time.time()))
        elapsed = time.monotonic() - wall
        server_cores = (sum(server.cpu_times()[:2]) - cpu) / elapsed
        load = os.getloadavg()[0]
        reports = [_collect(p, c, 120) for p, c in runs]
        time.sleep(max(0.0, end + 2 - time.time()))
        results.append({"mode": mode, "elapsed": elapsed, "server_cores": server_cores,
                        "load_average_1m": load, "reports": reports})
    sent = [_collect(p, c, until - time.time() + 120)["sent"] for p, c in agent_runs]
    return [_summary(r, _heartbeats(sent, windows[i]), agents, args) for i, r in enumerate(results)]


def _heartbeats(sent: list[dict[str, int]], window: list[float]) -> float:
    """Heartbeats a second the agents sent over the window's whole seconds."""
    first, last = math.ceil(window[0]), int(window[1])
    count = sum(n for per_second in sent for second, n in per_second.items() if first <= int(second) < last)
    return count / max(1, last - first)


def _summary(result: dict, per_s: float, agents: list[dict], args) -> dict:
    reports, elapsed = result["reports"], result["elapsed"]
    merged = {k: [v for r in reports for v in r[k]] for k in ("latency", "in_server", "delivery")}
    latencies, frames = merged["latency"], sum(r["frames"] for r in reports)
    versions = [v for r in reports for v in r["versions"]]  # (rendered at, hub version) in the window
    (t0, v0), (t1, v1) = (min(versions), max(versions)) if versions else ((0.0, 0), (0.0, 0))
    ingested = (v1 - v0) / (t1 - t0) if t1 > t0 else float("nan")
    return {
        "mode": result["mode"], "gpus": len(agents) * args.gpus_per_node, "nodes": len(agents),
        "dashboards": args.dashboards, "probes": args.probes, "seconds": elapsed,
        "heartbeats_per_s": per_s, "heartbeats_ingested_per_s": ingested, "samples": len(latencies),
        "expected_samples": per_s * elapsed * args.gpus_per_node * args.probes,
        "p50_ms": 1000 * percentile(latencies, 0.5), "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99), "max_ms": 1000 * max(latencies, default=float("nan")),
        "sent_to_rendered_p50_ms": 1000 * percentile(merged["in_server"], 0.5),
        "sent_to_rendered_p99_ms": 1000 * percentile(merged["in_server"], 0.99),
        "rendered_to_browser_p50_ms": 1000 * percentile(merged["delivery"], 0.5),
        "rendered_to_browser_p99_ms": 1000 * percentile(merged["delivery"], 0.99),
        "frames_per_socket_s": frames / args.dashboards / elapsed,
        "frame_kb": sum(r["bytes"] for r in reports) / max(1, frames) / 1024,
        "server_cores": result["server_cores"],
        # Per heartbeat the hub ingested (its version counts them): a server that falls behind the
        # agents has ingested fewer than were sent, and spent its CPU on those.
        "server_cpu_ms_per_heartbeat": 1000 * result["server_cores"] / ingested if ingested else float("nan"),
        # Other work on the machine skews every figure: the benchmark reports the load it ran under.
        "load_average_1m": result["load_average_1m"], "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--dashboards", type=int, default=50)
    parser.add_argument("--probes", type=int, default=5,
                        help="dashboards that parse every frame and time its samples")
    parser.add_argument("--modes", nargs="+", choices=["full", "delta"], default=["full", "delta"])
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--agent-processes", type=int, default=2)
    parser.add_argument("--dashboard-processes", type=int, default=2)
    parser.add_argument("--markdown", action="store_true", help="print table rows for docs/benchmarks.md")
    parser.add_argument("--server-log", type=Path, help="keep the server's output in this file")
    args = parser.parse_args()
    if not 0 < args.probes <= args.dashboards:
        parser.error(f"--probes {args.probes}: expected 1 to --dashboards ({args.dashboards})")
    nodes = math.ceil(args.gpus / args.gpus_per_node)
    with tempfile.TemporaryDirectory(prefix="telemetry-bench-") as tmp:
        var_dir = Path(tmp)
        agents, session = setup_install(var_dir, nodes, args.gpus_per_node)
        port = _free_port()
        env = {**os.environ, "MOTLEY_LOG_LEVEL": "WARNING"}
        with (args.server_log or var_dir / "server.log").open("wb") as log:
            process = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                        "controlplane.asgi:application"], cwd=ROOT, env=env, stdout=log,
                                       stderr=subprocess.STDOUT)
        try:
            _wait_for_port(port)
            results = measure(port, agents, session, args, psutil.Process(process.pid))
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    interval = float(os.environ.get("MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S", "0.5"))
    if not args.markdown:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(f"| {r['mode']} | {r['gpus']} | {r['nodes']} | {r['dashboards']} ({r['probes']}) | "
              f"{interval} | "
              f"{r['heartbeats_per_s']:.0f} | {r['heartbeats_ingested_per_s']:.0f} | "
              f"{r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | "
              f"{r['max_ms']:.0f} | {r['samples'] / max(1, r['expected_samples']):.0%} | "
              f"{r['frames_per_socket_s']:.1f} | {r['frame_kb']:.0f} | {r['server_cores']:.2f} | "
              f"{r['server_cpu_ms_per_heartbeat']:.2f} | {r['load_average_1m']:.1f} / {r['cpus']} |")
    full, delta = (next((r for r in results if r["mode"] == m), None) for m in ("full", "delta"))
    if full and delta and full["frame_kb"] and delta["frame_kb"]:  # no ratio of windows without a frame
        print(f"\ndelta / full: p99 {delta['p99_ms'] / full['p99_ms']:.2f}x, frame size "
              f"{delta['frame_kb'] / full['frame_kb']:.2f}x, server CPU per heartbeat "
              f"{delta['server_cpu_ms_per_heartbeat'] / full['server_cpu_ms_per_heartbeat']:.2f}x")


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout_s: float = 30.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"the server did not listen on port {port} within {timeout_s}s")


if __name__ == "__main__":
    main()
