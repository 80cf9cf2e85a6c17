"""Telemetry ingest: each heartbeat's sample goes to browsers as it arrives; the latest one is kept.

The agents' socket (``enrollment.consumers``) builds a node's sample from each heartbeat
(``telemetry_sample``), keeps it as the node's latest in the cache every process shares
(``telemetry_keep``; read through ``selectors.py``: samples are superseded every second and losing
one costs nothing) and publishes it at once, from its event loop, to the Channels group
``telemetry`` (``telemetry_publish``): no database, no thread hop, no throttle. Pacing is the
browser sockets' business: the dashboard's hub (``hub.py``) is one subscriber per server process
and each ``/ws/dashboard/`` socket takes snapshots at its own pace.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache

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
    """Keep ``sample`` as its node's latest, for ``MOTLEY_TELEMETRY_SAMPLE_TTL_S``.

    One cache write per heartbeat. The node's listing (``NODES_KEY``) and its stages' index
    (``stage_node_key`` → node) are written too when ``new_node`` (a connection's first heartbeat),
    when its stages changed, or every ``REFRESH_S``. A cache that cannot be reached loses the sample
    (logged at most once a minute), never the heartbeat: the agents' socket goes on.
    """
    global _warned_at
    node = sample["node"]
    ttl = settings.MOTLEY_TELEMETRY_SAMPLE_TTL_S
    stage_keys = tuple(sorted(str(s["stage_key"]) for s in sample["stages"] if s.get("stage_key")))
    now = time.monotonic()
    last = _refreshed.get(node)
    refresh = new_node or last is None or last[1] != stage_keys or now - last[0] > REFRESH_S
    try:
        if not refresh:
            cache.set(node_sample_key(node), sample, ttl)
            return
        cache.set_many({node_sample_key(node): sample}, ttl)
        if stage_keys:
            cache.set_many({stage_node_key(k): node for k in stage_keys}, ttl + 3 * REFRESH_S)
        nodes = cache.get(NODES_KEY) or []
        if node not in nodes:
            cache.set(NODES_KEY, sorted({*nodes, node}), None)
        _refreshed[node] = (now, stage_keys)
    except CACHE_ERRORS as exc:  # Redis down or slow: telemetry is lossy, control is not
        _refreshed.pop(node, None)
        if now - _warned_at > 60:
            _warned_at = now
            logger.warning("telemetry: could not keep the latest sample of %s in the cache: %s", node, exc)


def telemetry_message(sample: dict[str, Any]) -> dict[str, Any]:
    """The group message carrying one heartbeat's sample: the only shape published to ``GROUP``.

    ``TelemetryHub.ingest`` reads it (``hub.py``).
    """
    return {"type": "telemetry.sample", "sample": sample}


async def telemetry_publish(layer, sample: dict[str, Any]) -> None:
    """Send ``sample`` to every subscriber of the group ``telemetry`` (lossy: a full channel drops it)."""
    await layer.group_send(GROUP, telemetry_message(sample))
