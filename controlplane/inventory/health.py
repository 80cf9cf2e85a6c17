"""A device's observed health, from the samples its agent sends with each heartbeat (contracts §3).

The rule (``observed_health``), per device, from its latest ``GpuMetrics``:

- **unhealthy** when it reports critical XID errors since its agent started (``xid_errors > 0``) or
  uncorrected ECC errors since its last reset (``ecc_errors > 0``): the planner keeps off it;
- **degraded** when it has been throttled for a reason other than its power budget
  (``contracts.metrics.SLOWDOWN_REASONS``: thermal, hardware slowdown, power brake) in every sample
  for ``throttle_sustained_s()`` (10 s by default), or reports retired pages / remapped rows: still
  planned on, flagged for an operator;
- **healthy** otherwise. A counter a card does not report (None) is no evidence either way.

It is cheap on the agents' socket: each connection keeps a ``DeviceHealthWatch`` that works the rule
out in memory on every heartbeat and goes to the database (``device_health_observe``, one small
transaction writing only the rows that differ) only on the connection's first heartbeat and when a
device's observation changes, never once per heartbeat per device. The reason text is stable while
the observation is (no running durations in it), so a throttled card is written once, not every second.

What is observed never touches ``health_override`` (the operator's word), and the effective
``Device.health`` is the override else the observation (``models.effective_health``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from contracts.metrics import SLOWDOWN_REASONS
from controlplane.inventory.models import Device, effective_health

logger = logging.getLogger(__name__)

Observation = tuple[str, str]  # (Device.Health value, reason)


def throttle_sustained_s() -> float:
    """How long a card must stay throttled before it is observed DEGRADED
    (``MOTLEY_DEVICE_THROTTLE_SUSTAINED_S``)."""
    return settings.MOTLEY_DEVICE_THROTTLE_SUSTAINED_S


def _count(sample: Mapping[str, Any], field: str) -> int:
    value = sample.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def slowdown_reasons(sample: Mapping[str, Any]) -> list[str]:
    reasons = sample.get("throttle_reasons")
    return [r for r in reasons if r in SLOWDOWN_REASONS] if isinstance(reasons, (list, tuple)) else []


def observed_health(sample: Mapping[str, Any], *, throttled_for_s: float | None,
                    sustained_s: float) -> Observation:
    """The health one sample shows; ``throttled_for_s``: how long the card has been slowed down
    (None: not now)."""
    unhealthy = []
    if xids := _count(sample, "xid_errors"):
        unhealthy.append(f"{xids} critical XID error(s) since the agent started")
    if ecc := _count(sample, "ecc_errors"):
        unhealthy.append(f"{ecc} uncorrected ECC error(s) since the last reset")
    if unhealthy:
        return Device.Health.UNHEALTHY, "; ".join(unhealthy)
    degraded = []
    if throttled_for_s is not None and throttled_for_s >= sustained_s:
        degraded.append(f"throttled ({', '.join(slowdown_reasons(sample))}) for over {sustained_s:g} s")
    if pages := _count(sample, "retired_pages"):
        degraded.append(f"{pages} memory page(s) retired or row(s) remapped")
    if degraded:
        return Device.Health.DEGRADED, "; ".join(degraded)
    return Device.Health.HEALTHY, ""


class DeviceHealthWatch:
    """One agent connection's view of its node's devices: the observations last written, and since
    when each device has been slowed down."""

    def __init__(self, node_id: int, clock: Callable[[], float] = time.monotonic,
                 sustained_s: float | None = None):
        self.node_id = node_id
        self._clock = clock
        self._sustained_s = throttle_sustained_s() if sustained_s is None else sustained_s
        self._throttled_since: dict[int, float] = {}
        self._written: dict[int, Observation] = {}

    def changes(self, devices: Any) -> dict[int, Observation]:
        """The devices whose observation differs from what this connection last wrote."""
        now, changed = self._clock(), {}
        for sample in devices if isinstance(devices, list) else ():
            index = sample.get("index") if isinstance(sample, dict) else None
            if not isinstance(index, int) or isinstance(index, bool):
                continue
            if slowdown_reasons(sample):
                throttled_for = now - self._throttled_since.setdefault(index, now)
            else:
                self._throttled_since.pop(index, None)
                throttled_for = None
            observation = observed_health(sample, throttled_for_s=throttled_for,
                                          sustained_s=self._sustained_s)
            if self._written.get(index) != observation:
                changed[index] = observation
        return changed

    async def heartbeat(self, devices: Any) -> None:
        """Record what changed; a failure is logged and retried with the next heartbeat."""
        changed = self.changes(devices)
        if not changed:
            return
        try:
            await database_sync_to_async(device_health_observe)(node_id=self.node_id, observed=changed)
        except Exception:  # health must not break the agent's socket; the next heartbeat retries
            logger.exception("device health of node %s: recording failed", self.node_id)
            return
        self._written.update(changed)


@transaction.atomic
def device_health_observe(*, node_id: int, observed: Mapping[int, Observation]) -> list[Device]:
    """Record the observed health of the node's devices (by index); returns the devices that changed.

    Only rows whose observation differs are written, in one statement; ``health_override`` is never
    touched, and ``health`` becomes the override else the new observation.
    """
    devices = Device.objects.select_for_update(of=("self",), no_key=True).select_related("node").filter(
        node_id=node_id, index__in=list(observed))
    changed = []
    now = timezone.now()
    for device in devices:
        health, reason = observed[device.index]
        if (device.observed_health, device.health_reason) == (health, reason):
            continue
        if device.observed_health != health:
            logger.warning("device %s observed %s%s", device.name, health, f": {reason}" if reason else "")
        device.observed_health, device.health_reason = health, reason
        device.health = effective_health(override=device.health_override, observed=health)
        device.last_updated = now
        changed.append(device)
    if changed:
        Device.objects.bulk_update(changed, ["observed_health", "health_reason", "health", "last_updated"])
    return changed

