"""The telemetry benchmark's load, each run in its own process (``telemetry_bench.py`` starts them):
simulated agents heartbeating on ``/ws/agents/`` and dashboards reading ``/ws/dashboard/``.

Separate processes because one cannot drive 10,000 GPUs and 50 dashboards and still measure them:
the agents' JSON and the dashboards' parsing would share one core with the clock they are timed by.
Each process gets its work and reports its figures as JSON through a pipe.

A dashboard socket subscribes to every node, with deltas or full snapshots (the mode measured), and
acks every frame by its version as the dashboard's live.js does. *Probe* sockets parse every frame
and apply it as the page does, timing each GPU sample from its agent's ``sent_at`` to the first frame
carrying it; the others read the frame's head only (its version and ``at``: when the server rendered
it) and ack, so that fifty sockets' worth of traffic costs the server what it would while the
client's parsing stays within the machine. One more socket per process shows no node: its frames
(fleet counts, every tick) time the hub's ingest by the version they carry.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time

import websockets

HEAD = re.compile(r'"version":(\d+),"at":([-0-9.e+]+)')


def heartbeat(agent: dict, gpus: int, seq: int) -> str:
    now = time.time()
    devices = [{"index": i, "utilization_pct": 50 + 40 * math.sin(now + i), "memory_used_bytes": 40 * 2**30,
                "memory_total_bytes": 80 * 2**30, "temperature_c": 60.0, "power_w": 300.0,
                "power_limit_w": 400.0, "sm_clock_mhz": 1410, "throttle_reasons": [],
                "pcie_tx_bytes_per_s": 1e9, "pcie_rx_bytes_per_s": 1e9}
               for i in range(gpus)]
    return json.dumps({"type": "heartbeat", "incarnation": agent["incarnation"], "seq": seq, "sent_at": now,
                       "devices": devices, "stages": []})


async def _connect(url: str, **options) -> websockets.ClientConnection:
    """Open a socket, trying again when a busy server drops the handshake (daphne closes one the
    application has not accepted within its connect timeout), as a real agent or page does."""
    for attempt in range(29):
        try:
            return await websockets.connect(url, max_size=None, open_timeout=60, **options)
        except (OSError, websockets.InvalidHandshake):
            await asyncio.sleep(1 + attempt % 5)
    return await websockets.connect(url, max_size=None, open_timeout=60, **options)


async def _agent(url: str, agent: dict, gpus: int, opening: asyncio.Semaphore, connected: list[int],
                 all_open: asyncio.Event, until: list[float], sent: dict[int, int]) -> None:
    headers = {"Authorization": f"Node {agent['node_id']}:{agent['credential']}"}
    async with opening:  # a few sockets open at a time, as agents starting across a fleet would
        socket = await _connect(url, additional_headers=headers)
    connected[0] += 1
    async with socket:
        # Heartbeats start once this process's sockets are all open: what is measured is a fleet
        # reporting, not a fleet joining (a first heartbeat goes through the database).
        await all_open.wait()
        await asyncio.sleep((agent["node_id"] % 1000) / 1000)  # spread the agents over the second
        seq = 0
        next_at = time.monotonic()
        while time.time() < until[0]:
            seq += 1
            await socket.send(heartbeat(agent, gpus, seq))
            second = int(time.time())
            sent[second] = sent.get(second, 0) + 1
            next_at += 1.0
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def run_agents(conn, url: str, agents: list[dict], gpus: int) -> None:
    """Open every agent's socket, then heartbeat every second on each; say ``{"ready": true}`` once
    all are open, take the time to stop at (``{"until": t}``), then report the heartbeats sent per
    second."""
    async def main() -> list:
        until, connected, sent = [float("inf")], [0], {}
        opening, all_open = asyncio.Semaphore(20), asyncio.Event()
        tasks = [asyncio.create_task(_agent(url, a, gpus, opening, connected, all_open, until, sent))
                 for a in agents]
        while connected[0] < len(agents) and not any(t.done() for t in tasks):
            await asyncio.sleep(0.2)
        all_open.set()
        failed = [repr(t.exception()) for t in tasks if t.done() and t.exception() is not None]
        conn.send_bytes(json.dumps({"ready": connected[0] == len(agents), "errors": failed[:3]}).encode())
        until[0] = json.loads(await asyncio.to_thread(conn.recv_bytes))["until"]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        return [sent, [repr(r) for r in results if isinstance(r, BaseException)]]

    sent, errors = asyncio.run(main())
    conn.send_bytes(json.dumps({"sent": sent, "errors": errors[:3], "failed": len(errors)}).encode())


async def _dashboard(url: str, origin: str, session: str, deltas: bool, probe: bool, start: float, end: float,
                     out: dict) -> None:
    headers = {"Cookie": f"sessionid={session}"}
    seen: dict[str, float] = {}
    async with await _connect(url, additional_headers=headers, origin=origin) as socket:
        await socket.send(json.dumps({"subscribe": {"nodes": "*", "deltas": deltas}}))
        while time.time() < end:
            try:
                text = await asyncio.wait_for(socket.recv(), timeout=1.0)
            except TimeoutError:
                continue
            arrived = time.time()
            frame = json.loads(text) if probe else None
            version, at = HEAD.search(text, 0, 200).groups()
            await socket.send(json.dumps({"ack": int(version)}))
            measuring = start <= arrived < end
            if measuring:
                out["frames"] += 1
                out["bytes"] += len(text)
                out["delivery"].append(arrived - float(at))
            # A GPU's new sample comes whole (devices) or as a patch; its sent_at is new either way.
            for name, fields in _samples(frame):
                if (sent_at := fields.get("sent_at")) is not None and seen.get(name) != sent_at:
                    seen[name] = sent_at
                    if measuring:
                        out["latency"].append(arrived - sent_at)
                        out["in_server"].append(float(at) - sent_at)


async def _ingest_meter(url: str, origin: str, session: str, start: float, end: float, out: dict) -> None:
    """A socket showing no node, sent a frame of fleet counts on every tick: each frame's hub version
    (the heartbeats it ingested) and ``at`` (when it rendered) time the server's ingest, however late
    the frames arrive. The first and last of the window go to ``out["versions"]``."""
    headers = {"Cookie": f"sessionid={session}"}
    async with await _connect(url, additional_headers=headers, origin=origin) as socket:
        await socket.send(json.dumps({"subscribe": {"nodes": []}}))
        while time.time() < end:
            try:
                text = await asyncio.wait_for(socket.recv(), timeout=1.0)
            except TimeoutError:
                continue
            version, at = HEAD.search(text, 0, 200).groups()
            await socket.send(json.dumps({"ack": int(version)}))
            if start <= float(at) < end:
                out["versions"][:] = [min([*out["versions"], (float(at), int(version))]),
                                      max([*out["versions"], (float(at), int(version))])]


async def fleet_heard(url: str, origin: str, session: str, nodes: int, timeout_s: float) -> None:
    """Wait until the server's hub has a sample of ``nodes`` nodes (every agent's first heartbeat
    recorded and published), read from the frames' fleet counts with a subscription to no node."""
    headers = {"Cookie": f"sessionid={session}"}
    deadline = time.monotonic() + timeout_s
    async with await _connect(url, additional_headers=headers, origin=origin) as socket:
        await socket.send(json.dumps({"subscribe": {"nodes": []}}))
        heard = 0
        while heard < nodes:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server heard {heard} of {nodes} nodes within {timeout_s:.0f}s")
            frame = json.loads(await asyncio.wait_for(socket.recv(), timeout=timeout_s))
            heard = frame["fleet"]["nodes"]
            await socket.send(json.dumps({"ack": frame["version"]}))


def _samples(frame: dict | None):
    if frame is not None:
        yield from frame["devices"].items()
        yield from frame.get("patches", {}).items()


def run_dashboards(conn, url: str, origin: str, session: str, deltas: bool, sockets: int, probes: int,
                   start: float, end: float) -> None:
    """``sockets`` dashboards (the first ``probes`` of them parsing every frame) until ``end``; report
    what arrived from ``start`` on."""
    out = {"frames": 0, "bytes": 0, "delivery": [], "latency": [], "in_server": [], "versions": []}

    async def main() -> list[str]:
        results = await asyncio.gather(*(_dashboard(url, origin, session, deltas, i < probes, start, end, out)
                                         for i in range(sockets)),
                                       _ingest_meter(url, origin, session, start, end, out),
                                       return_exceptions=True)
        return [repr(r) for r in results if isinstance(r, BaseException)]

    errors = asyncio.run(main())
    conn.send_bytes(json.dumps({**out, "errors": errors[:3], "failed": len(errors)}).encode())
