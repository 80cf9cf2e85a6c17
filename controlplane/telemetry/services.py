"""Telemetry ingest: each heartbeat's sample goes to browsers as it arrives; the latest one is kept.

The agents' socket (``enrollment.consumers``) builds a node's sample from each heartbeat
(``telemetry_sample``), keeps it in Django's cache (``telemetry_keep``: samples are superseded every
second and losing them costs nothing) and publishes it at once, from its event loop, to the Channels
group ``telemetry`` (``telemetry_publish``): no database, no thread hop, no throttle. Pacing is the
browser sockets' business: the dashboard's hub (``hub.py``) is one subscriber per server process
and each ``/ws/dashboard/`` socket takes snapshots at its own pace; ``/ws/telemetry/`` sends the
fleet snapshot (``telemetry_snapshot``) at most once per ``MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S``.
"""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.cache import cache

from controlplane.telemetry.schema import GROUP

_NODES_KEY = "telemetry:nodes"


def _sample_key(node_id: int) -> str:
    return f"telemetry:node:{node_id}"


def telemetry_sample(*, node_id: int, node_name: str, heartbeat: dict[str, Any],
                     received_at: float | None = None) -> dict[str, Any]:
    """A node's sample from one heartbeat (contracts §3): its devices' metrics and its stages' stats."""
    return {
        "node_id": node_id,
        "node": node_name,
        "received_at": time.time() if received_at is None else received_at,
        "sent_at": heartbeat.get("sent_at"),
        "devices": heartbeat.get("devices") or [],
        "stages": [
            {k: s.get(k) for k in ("stage_key", "deployment_id", "replica", "stage_index", "state", "stats")}
            for s in heartbeat.get("stages") or () if isinstance(s, dict)
        ],
    }


def telemetry_keep(sample: dict[str, Any], *, new_node: bool = True) -> None:
    """Keep ``sample`` as its node's latest (``new_node``: also list the node, once per connection)."""
    cache.set(_sample_key(sample["node_id"]), sample, settings.MOTLEY_TELEMETRY_SAMPLE_TTL_S)
    if new_node:
        nodes = cache.get(_NODES_KEY, [])
        if sample["node_id"] not in nodes:
            cache.set(_NODES_KEY, sorted({*nodes, sample["node_id"]}), None)


def telemetry_message(sample: dict[str, Any]) -> dict[str, Any]:
    """The group message carrying one heartbeat's sample: the only shape published to ``GROUP``.

    ``TelemetryHub.ingest`` reads it; ``type`` names the handler of the ``/ws/telemetry/`` sockets
    (``TelemetryConsumer.telemetry_sample``).
    """
    return {"type": "telemetry.sample", "sample": sample}


async def telemetry_publish(layer, sample: dict[str, Any]) -> None:
    """Send ``sample`` to every subscriber of the group ``telemetry`` (lossy: a full channel drops it)."""
    await layer.group_send(GROUP, telemetry_message(sample))


def telemetry_snapshot() -> dict[str, Any]:
    """The latest sample of every node that reported within the sample lifetime."""
    node_ids = cache.get(_NODES_KEY, [])
    samples = cache.get_many([_sample_key(i) for i in node_ids])
    return {"at": time.time(), "nodes": sorted(samples.values(), key=lambda sample: sample["node"])}
