"""What a sync view computing in a thread does to the gateway's event loop, at CPython's default GIL
switch interval (5 ms) against the ASGI process's (controlplane/asgi.py: 1 ms), in one run.

    .venv/bin/python benchmarks/switch_interval_bench.py [--round-trips 300]

The gateway streams tokens from an asyncio loop in the ASGI process; Django runs sync views (a drain's
re-plan, a plan request) in a thread of the same process. Here one loop times a one-byte socket round
trip to an echo server on the same loop (each wake-up takes the GIL, as a token relayed to a client
does), idle and while a thread runs pure-Python arithmetic, at each switch interval. Printed: the
mean round trip idle and loaded per interval, and loaded at 1 ms over loaded at 5 ms. Not in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_INTERVAL_S = 0.005  # CPython's own


def compute(stop: threading.Event) -> None:
    """A sync view's CPU-bound Python (the planner's loops), until ``stop``."""
    total = 0
    while not stop.is_set():
        for i in range(10_000):
            total += i * i


async def round_trip_s(port: int, count: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    began = time.perf_counter()
    for _ in range(count):
        writer.write(b"x")
        await writer.drain()
        await reader.readexactly(1)
    writer.close()
    await writer.wait_closed()
    return (time.perf_counter() - began) / count


async def measure(interval_s: float, count: int) -> tuple[float, float]:
    """(idle, loaded) mean round trip at ``interval_s``."""
    sys.setswitchinterval(interval_s)

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    idle = await round_trip_s(port, count)
    stop = threading.Event()
    thread = threading.Thread(target=compute, args=(stop,))
    thread.start()
    try:
        loaded = await round_trip_s(port, count)
    finally:
        stop.set()
        thread.join()
        server.close()
        await server.wait_closed()
    return idle, loaded


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--round-trips", type=int, default=300)
    args = parser.parse_args()
    from controlplane.asgi import GIL_SWITCH_INTERVAL_S  # sets it too: measured explicitly below

    results = {}
    for interval in (DEFAULT_INTERVAL_S, GIL_SWITCH_INTERVAL_S):
        results[interval] = asyncio.run(measure(interval, args.round_trips))
    print("| switch interval | round trip, idle | round trip, a thread computing |")
    print("| ---: | ---: | ---: |")
    for interval, (idle, loaded) in results.items():
        print(f"| {interval * 1000:g} ms | {idle * 1e6:.0f} us | {loaded * 1e6:.0f} us |")
    ratio = results[GIL_SWITCH_INTERVAL_S][1] / results[DEFAULT_INTERVAL_S][1]
    print(f"\nloaded round trip at {GIL_SWITCH_INTERVAL_S * 1000:g} ms / at {DEFAULT_INTERVAL_S * 1000:g} "
          f"ms: {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
