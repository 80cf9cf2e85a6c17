"""Telemetry benchmark: agents' heartbeats to dashboard browsers, through the real ASGI server.

    .venv/bin/python benchmarks/telemetry_bench.py [--gpus 1000] [--gpus-per-node 8]
        [--dashboards 20] [--duration 30] [--warmup 5] [--markdown]

Starts daphne serving ``controlplane.asgi`` on a fresh embedded install (SQLite, in-memory channel
layer), registers ``gpus / gpus-per-node`` nodes with real join tokens, then runs, in this one
process, one websocket per simulated agent on ``/ws/agents/`` sending a contracts §3 heartbeat
every second, and ``dashboards`` logged-in browser sockets on ``/ws/dashboard/`` that acknowledge
every snapshot as the dashboard's JS does.

Latency is agent-to-browser: for every GPU sample, the time from the agent's ``sent_at`` to the
first snapshot that carries it arriving at a browser socket, for every socket (same machine, same
clock), also split into agent's send to snapshot rendered (the snapshot's ``at``) and rendered to
arrived. CPU is the server process's user+system time over the measured window, in cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil
import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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


def heartbeat(agent: dict, gpus: int, seq: int) -> str:
    now = time.time()
    devices = [{"index": i, "utilization_pct": 50 + 40 * math.sin(now + i), "memory_used_bytes": 40 * 2**30,
                "memory_total_bytes": 80 * 2**30, "temperature_c": 60.0, "power_w": 300.0,
                "power_limit_w": 400.0, "sm_clock_mhz": 1410, "throttle_reasons": [],
                "pcie_tx_bytes_per_s": 1e9, "pcie_rx_bytes_per_s": 1e9}
               for i in range(gpus)]
    return json.dumps({"type": "heartbeat", "incarnation": agent["incarnation"], "seq": seq, "sent_at": now,
                       "devices": devices, "stages": []})


async def run_agent(url: str, agent: dict, gpus: int, stop: asyncio.Event, sent: list[int]) -> None:
    headers = {"Authorization": f"Node {agent['node_id']}:{agent['credential']}"}
    async with websockets.connect(url, additional_headers=headers, max_size=None) as socket:
        await asyncio.sleep((agent["node_id"] % 1000) / 1000)  # spread the agents over the second
        seq = 0
        next_at = time.monotonic()
        while not stop.is_set():
            seq += 1
            await socket.send(heartbeat(agent, gpus, seq))
            sent[0] += 1
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def run_dashboard(url: str, origin: str, session: str, stop: asyncio.Event, measuring: asyncio.Event,
                        latencies: list[float], counts: list[int], parts: dict[str, list[float]]) -> None:
    headers = {"Cookie": f"sessionid={session}"}
    seen: dict[str, float] = {}
    async with websockets.connect(url, additional_headers=headers, origin=origin, max_size=None) as socket:
        while not stop.is_set():
            try:
                text = await asyncio.wait_for(socket.recv(), timeout=1.0)
            except TimeoutError:
                continue
            arrived = time.time()
            snapshot = json.loads(text)
            await socket.send(json.dumps({"ack": snapshot["version"]}))
            for name, sample in snapshot["devices"].items():
                sent_at = sample["sent_at"]
                if seen.get(name) != sent_at:
                    seen[name] = sent_at
                    if measuring.is_set():
                        latencies.append(arrived - sent_at)
                        parts["in_server"].append(snapshot["at"] - sent_at)
            if measuring.is_set():
                counts[0] += 1
                counts[1] += len(text)
                parts["delivery"].append(arrived - snapshot["at"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(port: int, agents: list[dict], session: str, gpus_per_node: int, dashboards: int,
                  warmup: float, duration: float, server: psutil.Process) -> dict:
    base = f"ws://127.0.0.1:{port}"
    stop, measuring = asyncio.Event(), asyncio.Event()
    latencies: list[float] = []
    # Where the latency goes: agent's send to the snapshot rendered (per sample), and rendered to
    # arrived at the browser (per snapshot).
    parts: dict[str, list[float]] = {"in_server": [], "delivery": []}
    counts = [[0, 0] for _ in range(dashboards)]
    sent = [0]
    origin = f"http://127.0.0.1:{port}"
    tasks = [asyncio.create_task(run_dashboard(f"{base}/ws/dashboard/", origin, session, stop, measuring,
                                               latencies, counts[i], parts)) for i in range(dashboards)]
    tasks += [asyncio.create_task(run_agent(f"{base}/ws/agents/", a, gpus_per_node, stop, sent))
              for a in agents]
    await asyncio.sleep(warmup)
    me = psutil.Process()
    server_cpu, my_cpu, wall = sum(server.cpu_times()[:2]), sum(me.cpu_times()[:2]), time.monotonic()
    sent_before = sent[0]
    measuring.set()
    await asyncio.sleep(duration)
    measuring.clear()
    elapsed = time.monotonic() - wall
    server_cores = (sum(server.cpu_times()[:2]) - server_cpu) / elapsed
    client_cores = (sum(me.cpu_times()[:2]) - my_cpu) / elapsed
    heartbeats = sent[0] - sent_before
    stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise RuntimeError(f"{len(errors)} sockets failed, first: {errors[0]!r}")
    snapshots = sum(c[0] for c in counts)
    return {
        "gpus": len(agents) * gpus_per_node, "nodes": len(agents), "dashboards": dashboards,
        "seconds": elapsed,
        "heartbeats_per_s": heartbeats / elapsed, "samples": len(latencies),
        "expected_samples": heartbeats * gpus_per_node * dashboards,
        "p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99), "max_ms": 1000 * max(latencies),
        "sent_to_rendered_p50_ms": 1000 * statistics.median(parts["in_server"]),
        "sent_to_rendered_p99_ms": 1000 * percentile(parts["in_server"], 0.99),
        "rendered_to_browser_p50_ms": 1000 * statistics.median(parts["delivery"]),
        "rendered_to_browser_p99_ms": 1000 * percentile(parts["delivery"], 0.99),
        "snapshots_per_socket_s": snapshots / dashboards / elapsed,
        "snapshot_kb": counts[0][1] / max(1, counts[0][0]) / 1024,
        "server_cores": server_cores, "client_cores": client_cores,
        # Other work on the machine skews every figure: the benchmark reports the load it ran under.
        "load_average_1m": os.getloadavg()[0], "cpus": os.cpu_count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--dashboards", type=int, default=20)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--markdown", action="store_true", help="print a table row for docs/benchmarks.md")
    parser.add_argument("--server-log", type=Path, help="keep the server's output in this file")
    args = parser.parse_args()
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
            result = asyncio.run(measure(port, agents, session, args.gpus_per_node, args.dashboards,
                                         args.warmup, args.duration, psutil.Process(process.pid)))
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        result["snapshot_interval_s"] = float(os.environ.get("MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S", "0.5"))
    if args.markdown:
        r = result
        print(f"| {r['gpus']} | {r['nodes']} | {r['dashboards']} | "
              f"none / {r['snapshot_interval_s']} | "
              f"{r['heartbeats_per_s']:.0f} | {r['p50_ms']:.0f} | {r['p95_ms']:.0f} | {r['p99_ms']:.0f} | "
              f"{r['max_ms']:.0f} | {r['snapshots_per_socket_s']:.1f} | {r['snapshot_kb']:.0f} | "
              f"{r['server_cores']:.2f} | {r['client_cores']:.2f} | "
              f"{r['load_average_1m']:.1f} / {r['cpus']} |")
    else:
        print(json.dumps(result, indent=2))


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
