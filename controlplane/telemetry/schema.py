"""The shapes the telemetry modules share, defined once: the channel-layer group, the cache keys of the
latest samples, the fields kept as history (contracts.metrics names them, next to what agents send)
and a closed rollup bucket.

``services`` publishes to ``GROUP`` and keeps samples under the cache keys; ``selectors`` reads them;
the hub (``hub.py``) subscribes and closes ``Rollup`` buckets; the rollup store (``rollups.py``)
writes and reads them; each imports this module, none the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis import RedisError

from contracts.metrics import GPU_FIELDS, STAGE_FIELDS

# The channel-layer group every heartbeat's sample is published to (one message per heartbeat).
GROUP = "telemetry"
# The cache (settings.CACHES, shared by every process) holds each node's latest sample, the list of
# nodes that reported, and which node last reported each stage (so a stage's sample is two reads).
NODES_KEY = "telemetry:nodes"
# What a cache that cannot be reached raises (Redis, or the files of the embedded default); telemetry
# is lossy, so readers and writers take it as "no sample" rather than fail.
CACHE_ERRORS = (OSError, ValueError, RedisError)


def node_sample_key(node: str) -> str:
    return f"telemetry:node:{node}"


def stage_node_key(stage_key: str) -> str:
    return f"telemetry:stage:{stage_key}"

# The fields kept as history and rollups, per kind of series: "device" (a GPU) or "stage".
FIELDS: dict[str, tuple[str, ...]] = {"device": GPU_FIELDS, "stage": STAGE_FIELDS}


@dataclass(frozen=True)
class Rollup:
    """Mean and peak of each field of one device or stage over one bucket (JSON NaN-free)."""

    kind: str  # "device" | "stage"
    key: str  # device name "<node>/gpu<i>" or stage key
    bucket_start: float  # unix seconds, a multiple of the bucket length
    seconds: int
    samples: int
    mean: dict[str, float]
    peak: dict[str, float]
