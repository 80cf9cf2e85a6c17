"""The latest telemetry of a node, a device or a stage, with its age: what every reader goes through.

One state for every process: the agents' socket keeps each node's latest sample in Django's cache
(``services.telemetry_keep``), which is Redis in service mode and a SQLite file under ``var/cache/`` in
the embedded default (settings.CACHES), so an ASGI process that did not receive a heartbeat, and the
Celery worker, read the same samples as the one that did. The dashboard, the gateway's router and
the planner's calibration read through these functions and nothing else.

Shapes:

- a node's sample (``services.telemetry_sample``, one per heartbeat)::

    {"node_id": int, "node": str,
     "received_at": float,        # control plane's time.time() when the heartbeat arrived
     "sent_at": float | None,     # the agent's clock
     "devices": [GpuMetrics dict],  # contracts/metrics.py: index, utilization_pct, memory_used_bytes, …
     "stages": [{"stage_key", "deployment_id", "replica", "stage_index", "state",
                 "stats": StageStats.snapshot() dict or None}]}

- ``Latest(value, node, received_at)``: ``value`` is one ``GpuMetrics`` dict (``device_sample``),
  one entry of ``stages`` (``stage_sample``) or the whole node sample (``node_sample``); ``node`` is
  the reporting node's name; ``age_s()`` and ``stale()`` say how much to trust it.

A sample stays ``MOTLEY_TELEMETRY_SAMPLE_TTL_S`` (30 s) in the cache and then reads as None; one older
than ``MOTLEY_TELEMETRY_STALE_AFTER_S`` (default: the node's SUSPECT threshold, 3 heartbeats) is
``stale()``. A cache that cannot be reached reads as no telemetry (logged), never as an error.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from django.conf import settings
from django.core.cache import cache

from contracts.names import device_name
from controlplane.telemetry.schema import CACHE_ERRORS, NODES_KEY, node_sample_key, stage_node_key

logger = logging.getLogger(__name__)

# Which of two reports of one stage key to believe (a stage moving between nodes is briefly reported
# by both): the one serving, then the one coming up, then the rest, the process on its way out last.
_STATE_RANK = {"ready": 0, "starting": 1, "pending": 2, "draining": 3, "exited": 4, "failed": 4}


class Latest(NamedTuple):
    """One reading from the latest sample of ``node``, received by the control plane at ``received_at``."""

    value: dict[str, Any]
    node: str
    received_at: float

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the heartbeat carrying it arrived (never negative)."""
        return max(0.0, (time.time() if now is None else now) - self.received_at)

    def stale(self, *, now: float | None = None, max_age_s: float | None = None) -> bool:
        """Older than ``max_age_s`` (default ``MOTLEY_TELEMETRY_STALE_AFTER_S``)."""
        limit = settings.MOTLEY_TELEMETRY_STALE_AFTER_S if max_age_s is None else max_age_s
        return self.age_s(now) > limit


def latest_samples() -> list[dict[str, Any]]:
    """The latest sample of every node that reported within the sample lifetime, by node name."""
    try:
        nodes = cache.get(NODES_KEY) or []
        samples = cache.get_many([node_sample_key(n) for n in nodes])
    except CACHE_ERRORS as exc:
        logger.warning("telemetry: cannot read the cache: %s", exc)
        return []
    return sorted(samples.values(), key=lambda sample: sample["node"])


def node_sample(node: str) -> Latest | None:
    """The latest sample of the node named ``node`` (its ``value`` is the whole node sample)."""
    sample = _read(node_sample_key(node))
    return Latest(sample, node, sample["received_at"]) if sample else None


def device_sample(name: str) -> Latest | None:
    """The latest ``GpuMetrics`` of the device named ``name`` ("<node>/gpu<i>"), from its node's sample."""
    node = name.split("/", 1)[0]
    sample = _read(node_sample_key(node))
    for metrics in (sample or {}).get("devices") or ():
        if isinstance(metrics, dict) and device_name(node, metrics.get("index")) == name:
            return Latest(metrics, node, sample["received_at"])
    return None


def stage_sample(stage_key: str) -> Latest | None:
    """The latest report of the stage ``stage_key`` ("d<deployment>-r<pipeline>-s<stage>").

    Two reads: which node last reported it, then that node's sample; a stage reported elsewhere
    since (or not indexed yet) is found among every node's samples.
    """
    node = _read(stage_node_key(stage_key))
    sample = _read(node_sample_key(node)) if node else None
    found = _stage_in(sample, stage_key) if sample else None
    if found is not None and _STATE_RANK.get(found.value.get("state"), 2) <= _STATE_RANK["pending"]:
        return found
    return stage_samples().get(stage_key, found)


def stage_samples(*, deployment_id: int | None = None) -> dict[str, Latest]:
    """Every stage's latest report by stage key (of one deployment, if given), from one scan."""
    found: dict[str, Latest] = {}
    for sample in latest_samples():
        for stage in sample.get("stages") or ():
            key = stage.get("stage_key")
            if not key or (deployment_id is not None and stage.get("deployment_id") != deployment_id):
                continue
            reading = Latest(stage, sample["node"], sample["received_at"])
            if key not in found or _better(reading, found[key]):
                found[key] = reading
    return found


def device_samples() -> dict[str, Latest]:
    """Every device's latest ``GpuMetrics`` by device name, from one scan."""
    return {
        device_name(sample["node"], metrics["index"]): Latest(metrics, sample["node"], sample["received_at"])
        for sample in latest_samples()
        for metrics in sample.get("devices") or ()
        if isinstance(metrics, dict) and "index" in metrics
    }


def _read(key: str) -> Any:
    try:
        return cache.get(key)
    except CACHE_ERRORS as exc:
        logger.warning("telemetry: cannot read the cache: %s", exc)
        return None


def _stage_in(sample: dict[str, Any], stage_key: str) -> Latest | None:
    for stage in sample.get("stages") or ():
        if stage.get("stage_key") == stage_key:
            return Latest(stage, sample["node"], sample["received_at"])
    return None


def _better(a: Latest, b: Latest) -> bool:
    rank_a, rank_b = (_STATE_RANK.get(x.value.get("state"), 2) for x in (a, b))
    return (rank_a, -a.received_at) < (rank_b, -b.received_at)
