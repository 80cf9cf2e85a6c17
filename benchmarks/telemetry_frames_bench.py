"""The telemetry hub's CPU per update, in one process without sockets: ingest of one node's heartbeat,
and per tick the frame every dashboard shares, a full snapshot against a delta, side by side.

    .venv/bin/python benchmarks/telemetry_frames_bench.py [--gpus 10000] [--ticks 20]

A hub (controlplane/telemetry/hub.py) is fed the heartbeats of ``gpus / gpus-per-node`` nodes, each
node once a second, in ticks of 0.5 s (the default ``MOTLEY_DASHBOARD_SNAPSHOT_INTERVAL_S``); at each
tick it renders the full snapshot of every node and the delta from the previous tick, as a socket
that acked the previous tick is sent (``frames.py``); plus, as the reference the frames replaced, the
whole state through one ``json.dumps``. Reported: CPU time per heartbeat ingested and per frame,
and each frame's size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")  # services reads settings
import django  # noqa: E402

django.setup()  # services imports the hub's runtime, which imports the rollups' model

from benchmarks.telemetry_sim import heartbeat  # noqa: E402
from controlplane.telemetry.frames import Subscription  # noqa: E402
from controlplane.telemetry.hub import TelemetryHub  # noqa: E402
from controlplane.telemetry.services import telemetry_message, telemetry_sample  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=10000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    nodes = math.ceil(args.gpus / args.gpus_per_node)
    hub, everything = TelemetryHub(), Subscription()
    def message(n: int) -> dict:
        beat = json.loads(heartbeat({"incarnation": 1}, args.gpus_per_node, 1))
        return telemetry_message(telemetry_sample(node_id=n, node_name=f"bench-{n:04d}", heartbeat=beat))

    messages = [[message(n) for n in range(nodes)] for _ in range(2)]  # two seconds' worth: samples differ
    for message in messages[0]:
        hub.ingest(message)
    held = hub.version
    cpu = {"ingest": 0.0, "snapshot": 0.0, "delta": 0.0, "one json.dumps": 0.0}
    size = {"snapshot": 0, "delta": 0, "one json.dumps": 0}
    ingested = 0
    for tick in range(args.ticks):
        half = messages[tick // 2 % 2][(tick % 2) * nodes // 2:(tick % 2 + 1) * nodes // 2]
        started = time.process_time()
        for message in half:
            message["sample"]["received_at"] = message["sample"]["sent_at"] = time.time()
            hub.ingest(message)
        cpu["ingest"] += time.process_time() - started
        ingested += len(half)
        hub.frames.new_tick()
        # The delta first: it pays for rendering the changed nodes' fragments, the snapshot joins them.
        for kind, render in (("delta", lambda: hub.frames.frame(everything, held)[1]),
                             ("snapshot", lambda: hub.frames.frame(everything, None)[1]),
                             ("one json.dumps", lambda: json.dumps(
                                 {"devices": hub.devices, "stages": hub.stages}, separators=(",", ":")))):
            started = time.process_time()
            text = render()
            cpu[kind] += time.process_time() - started
            size[kind] += len(text)
        held = hub.version
    print(f"{args.gpus} GPUs, {nodes} nodes, {args.ticks} ticks of 0.5 s")
    print(f"ingest: {1e3 * cpu['ingest'] / ingested:.3f} ms CPU per heartbeat ({args.gpus_per_node} GPUs)")
    for kind in ("one json.dumps", "snapshot", "delta"):
        print(f"{kind}: {1e3 * cpu[kind] / args.ticks:.1f} ms CPU per tick, "
              f"{size[kind] / args.ticks / 1024:.0f} KB")
    print(f"delta / snapshot: CPU {cpu['delta'] / cpu['snapshot']:.2f}x, "
          f"size {size['delta'] / size['snapshot']:.2f}x;"
          f" snapshot / one json.dumps: CPU {cpu['snapshot'] / cpu['one json.dumps']:.2f}x")


if __name__ == "__main__":
    main()
