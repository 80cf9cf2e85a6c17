"""The shapes the telemetry modules share, defined once: the channel-layer group, the fields kept as
history (contracts.metrics names them, next to what agents send) and a closed rollup bucket.

``services`` publishes to ``GROUP``; the hub (``hub.py``) subscribes and closes ``Rollup`` buckets;
the rollup store (``rollups.py``) writes and reads them; each imports this module, none the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.metrics import GPU_FIELDS, STAGE_FIELDS

# The channel-layer group every heartbeat's sample is published to (one message per heartbeat).
GROUP = "telemetry"
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
