"""Telemetry ingest: each heartbeat's sample goes to browsers as it arrives; the latest one is kept.

The agents' socket (``enrollment.consumers``) builds a node's sample from each heartbeat
(``telemetry_sample``), has it kept as the node's latest in the cache every process shares (the
process's ``keeper.SampleKeeper`` writes the latest of every node off the event loop, a few times a
second, through ``telemetry_keep_many``; read through ``selectors.py``: samples are superseded every
second and losing one costs nothing) and publishes it at once, from its event loop, to the Channels
group ``telemetry`` (``telemetry_publish``; with the in-memory layer, straight to this process's
hub): no database, no thread hop, no throttle. Pacing is the browser sockets' business: the
dashboard's hub (``hub.py``) is one subscriber per server process and each ``/ws/dashboard/`` socket
takes snapshots at its own pace.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from channels.layers import InMemoryChannelLayer
from django.conf import settings
from django.core.cache import cache

from controlplane.telemetry.runtime import running_hub
from controlplane.telemetry.schema import CACHE_ERRORS, GROUP, NODES_KEY, node_sample_key, stage_node_key

logger = logging.getLogger(__name__)

# How often a node's listing and stage index are written again though nothing changed: heals a
# listing lost to two processes adding nodes at once, and keeps the index entries from expiring.
REFRESH_S = 10.0
_refreshed: dict[str, tuple[float, tuple[str, ...]]] = {}  # node -> (when, stage keys) this process wrote
_warned_at = 0.0


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
    """Keep ``sample`` as its node's latest, now (``telemetry_keep_many``)."""
    telemetry_keep_many([(sample, new_node)])


def telemetry_keep_many(samples: list[tuple[dict[str, Any], bool]]) -> None:
    """Keep each ``(sample, new_node)``'s sample as its node's latest, in one cache write.

    The agents' sockets hand their samples to this process's ``keeper.SampleKeeper``, which calls
    this off the event loop every ``keeper.KEEP_INTERVAL_S`` with the latest of each node.
    A node's listing (``NODES_KEY``) and its stages' index (``stage_node_key`` → node) are written too
    when ``new_node`` (a connection's first heartbeat), when its stages changed, or every
    ``REFRESH_S``. A cache that cannot be reached loses the samples (logged at most once a minute),
    never a heartbeat.
    """
    global _warned_at
    ttl = settings.MOTLEY_TELEMETRY_SAMPLE_TTL_S
    now = time.monotonic()
    latest: dict[str, Any] = {}
    index: dict[str, str] = {}
    refreshed: dict[str, tuple[float, tuple[str, ...]]] = {}
    for sample, new_node in samples:
        node = sample["node"]
        latest[node_sample_key(node)] = sample
        keys = tuple(sorted(str(s["stage_key"]) for s in sample["stages"] if s.get("stage_key")))
        last = _refreshed.get(node)
        if new_node or last is None or last[1] != keys or now - last[0] > REFRESH_S:
            index.update({stage_node_key(k): node for k in keys})
            refreshed[node] = (now, keys)
    try:
        cache.set_many(latest, ttl)
        if index:
            cache.set_many(index, ttl + 3 * REFRESH_S)
        if refreshed:
            nodes = cache.get(NODES_KEY) or []
            if not set(refreshed) <= set(nodes):
                cache.set(NODES_KEY, sorted({*nodes, *refreshed}), None)
            _refreshed.update(refreshed)
    except CACHE_ERRORS as exc:  # Redis down or slow: telemetry is lossy, control is not
        for node in refreshed:
            _refreshed.pop(node, None)
        if now - _warned_at > 60:
            _warned_at = now
            logger.warning("telemetry: could not keep %d latest sample(s) in the cache: %s", len(latest), exc)


def telemetry_message(sample: dict[str, Any]) -> dict[str, Any]:
    """The group message carrying one heartbeat's sample: the only shape published to ``GROUP``.

    ``TelemetryHub.ingest`` reads it (``hub.py``).
    """
    return {"type": "telemetry.sample", "sample": sample}


async def telemetry_publish(layer, sample: dict[str, Any]) -> None:
    """Send ``sample`` to every subscriber of the group ``telemetry``, the hub of every server process
    (lossy: a full channel drops it).

    With Channels' in-memory layer (the embedded default: one server process, which agents and
    browsers share) the group's one subscriber is this process's hub, which takes the sample at once:
    through the layer it would be deep-copied and queued for another task to take out, which cost as
    much CPU as the hub's own ingest.
    """
    if isinstance(layer, InMemoryChannelLayer):
        running_hub().take(telemetry_message(sample))
    else:
        await layer.group_send(GROUP, telemetry_message(sample))
