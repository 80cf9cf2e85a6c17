"""The keeper: the agents' sockets note samples; the cache is written off the event loop, coalesced."""

from __future__ import annotations

import asyncio
import threading

from controlplane.telemetry import keeper, services
from controlplane.telemetry.selectors import node_sample
from controlplane.telemetry.services import telemetry_sample


def sample(node: str, received_at: float) -> dict:
    return telemetry_sample(node_id=1, node_name=node, heartbeat={"devices": [], "stages": []},
                            received_at=received_at)


async def test_the_latest_of_each_node_is_written_once_per_interval_off_the_loop(monkeypatch):
    monkeypatch.setattr(keeper, "KEEP_INTERVAL_S", 0.1)
    calls = []
    real = services.telemetry_keep_many

    def keep_many(batch):
        calls.append(([(s["node"], s["received_at"], new) for s, new in batch], threading.current_thread()))
        real(batch)

    monkeypatch.setattr(keeper, "telemetry_keep_many", keep_many)
    running = keeper.running_keeper()
    assert keeper.running_keeper() is running  # one per process and loop
    running.note(sample("n0", 1.0), new_node=True)
    running.note(sample("n0", 2.0))  # superseded before the write: only the latest is kept
    running.note(sample("n1", 3.0))
    assert node_sample("n0") is None  # nothing written on the loop
    await asyncio.sleep(0.25)
    [(batch, thread)] = calls
    assert sorted(batch) == [("n0", 2.0, True), ("n1", 3.0, False)]  # the first's listing is not lost
    assert thread is not threading.main_thread()
    assert node_sample("n0").received_at == 2.0 and node_sample("n1").received_at == 3.0
    await asyncio.sleep(0.25)
    assert len(calls) == 1  # nothing new, nothing written
