"""Telemetry ingest: keep each node's latest heartbeat sample and broadcast a fleet snapshot.

Samples live in Django's cache, not the database: they are superseded every second and losing them
costs nothing (delivery to browsers is lossy by design). Snapshots go to the Channels group
``telemetry`` at most once per ``MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S``, whatever the fleet's size.
"""

from __future__ import annotations

import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache

from controlplane.inventory.models import Node

GROUP = "telemetry"
_NODES_KEY = "telemetry:nodes"
_PUBLISHED_KEY = "telemetry:published_at"


def _sample_key(node_id: int) -> str:
    return f"telemetry:node:{node_id}"


def telemetry_ingest(*, node: Node, heartbeat: dict[str, Any]) -> None:
    ttl = settings.MOTLEY_TELEMETRY_SAMPLE_TTL_S
    sample = {
        "node_id": node.pk,
        "node": node.name,
        "received_at": time.time(),
        "sent_at": heartbeat.get("sent_at"),
        "devices": heartbeat.get("devices") or [],
        "stages": [
            {k: s.get(k) for k in ("stage_key", "deployment_id", "replica", "stage_index", "state", "stats")}
            for s in heartbeat.get("stages") or () if isinstance(s, dict)
        ],
    }
    cache.set(_sample_key(node.pk), sample, ttl)
    cache.set(_NODES_KEY, sorted({*cache.get(_NODES_KEY, []), node.pk}), None)
    if cache.add(_PUBLISHED_KEY, True, settings.MOTLEY_TELEMETRY_PUBLISH_INTERVAL_S):
        async_to_sync(get_channel_layer().group_send)(
            GROUP, {"type": "telemetry.snapshot", "snapshot": telemetry_snapshot()}
        )


def telemetry_snapshot() -> dict[str, Any]:
    """The latest sample of every node that reported within the sample lifetime."""
    node_ids = cache.get(_NODES_KEY, [])
    samples = cache.get_many([_sample_key(i) for i in node_ids])
    return {"at": time.time(), "nodes": sorted(samples.values(), key=lambda sample: sample["node"])}
