"""The router's live inputs: each replica's health and costs from its agents' telemetry, its head's
statistics and the gateway's own outcomes.

Per replica (``ReplicaEndpoint.stages`` says where its stages run):

- **telemetry** (``controlplane.telemetry.selectors``: each node's latest sample, with its age): per
  device, throttling (``1 - sm_clock / sm_clock_max`` while NVML reports a throttle reason) and
  memory in use; per stage, its state and statistics (step time at the current batch). A sample
  older than ``TELEMETRY_STALE_S`` or missing makes the replica unhealthy (``routing.signals``);
- **the head** (polled every ``REFRESH_S``): whether the pipeline serves, free KV per stage, the
  queue and the summary of the prompt prefixes it caches (``runtime.Gateway._poll``); a head that
  does not answer makes it unhealthy; a malformed summary is logged once and counts as none;
- **the gateway's outcomes** (``telemetry.recorder``): the share of its recent requests that failed;
- **measured costs**: the plan's costs scaled by the stages' measured / predicted step time
  (``routing.MeasuredCosts``) once three telemetry samples with steps exist.

``LiveHealth.apply`` composes them into the replica's ``ReplicaHealth`` and costs and keeps what it
used for the router's statistics (``runtime.gateway_stats``). ``MOTLEY_GATEWAY["LIVE_TELEMETRY"]``
False routes blind to telemetry (the head's statistics and the source's figures only).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from django.conf import settings

from contracts.prefix_cache import PrefixSummary
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.routing import (
    DeviceSample,
    MeasuredCosts,
    Reading,
    ReplicaHealth,
    ReplicaState,
    StageSample,
    replica_reading,
)
from controlplane.gateway.serving.decision_log import recorder
from controlplane.gateway.serving.directory import ReplicaEndpoint
from controlplane.telemetry.selectors import device_samples, stage_samples

log = logging.getLogger(__name__)


def stale_after_s() -> float:
    """How old a device's or stage's sample may be before its replica counts as unhealthy: the
    gateway's ``TELEMETRY_STALE_S``, else ``MOTLEY_TELEMETRY_STALE_AFTER_S`` (the node's SUSPECT
    threshold: three heartbeats)."""
    configured = gateway_setting("TELEMETRY_STALE_S")
    return float(configured) if configured else float(settings.MOTLEY_TELEMETRY_STALE_AFTER_S)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class TelemetryView:
    """The latest sample of every device (by ``<node>/gpu<i>``) and stage (by stage key), with ages."""

    devices: dict[str, DeviceSample]
    stages: dict[str, StageSample]
    at: float  # wall clock of the read: ages count to it

    def of(self, links, *, now: float) -> tuple[dict[str, DeviceSample], dict[str, StageSample]]:
        """The samples of these stages and their devices, aged to ``now``."""
        later = max(0.0, now - self.at)
        devices = {link.device: replace(d, age_s=d.age_s + later) for link in links
                   if link.device is not None and (d := self.devices.get(link.device)) is not None}
        stages = {link.stage_key: replace(s, age_s=s.age_s + later) for link in links
                  if (s := self.stages.get(link.stage_key)) is not None}
        return devices, stages


def telemetry_view(*, now: float | None = None) -> TelemetryView:
    """The agents' latest samples of every device and stage (``controlplane.telemetry.selectors``:
    each node's last heartbeat, in the cache every process shares), aged to ``now``."""
    now = time.time() if now is None else now
    devices = {
        name: DeviceSample(
            name, latest.age_s(now), int(d.get("memory_used_bytes") or 0),
            int(d.get("memory_total_bytes") or 0),
            _number(d.get("sm_clock_mhz")), _number(d.get("sm_clock_max_mhz")),
            tuple(d.get("throttle_reasons") or ()),
        )
        for name, latest in device_samples().items() if isinstance(d := latest.value, dict)
    }
    stages = {}
    for key, latest in stage_samples().items():
        stats = latest.value.get("stats") or {}
        stages[key] = StageSample(
            key, latest.age_s(now), latest.value.get("state"), _number(stats.get("step_ms")),
            _number(stats.get("batch_size")), stats.get("queue_depth"), stats.get("kv_tokens_free"),
        )
    return TelemetryView(devices, stages, now)


@dataclass
class HeadView:
    """The last answer of a replica's head to a statistics call. ``prefix_summary``: its parsed
    ``prefix_cache`` (None: caching off, or ``prefix_error`` says why it could not be read)."""

    ok: bool
    reason: str
    at: float  # wall clock
    stats: dict = field(default_factory=dict)
    prefix_summary: PrefixSummary | None = None
    prefix_error: str = ""

    @property
    def shown_stats(self) -> dict:
        """The statistics as operators read them: the summary's filter by its size, not its bits (up
        to 32 KiB a replica, polled every ``REFRESH_S``)."""
        raw = self.stats.get("prefix_cache")
        if not isinstance(raw, dict) or "bloom" not in raw:
            return self.stats
        shown = {k: v for k, v in raw.items() if k != "bloom"}
        if self.prefix_summary is not None:
            shown["bloom_bytes"] = len(self.prefix_summary.bits)
        return {**self.stats, "prefix_cache": shown}

    @property
    def kv_tokens_free(self) -> int | None:
        free = self.stats.get("kv_tokens_free_by_stage") or {}
        return min(free.values()) if free else None


def compose(*, stated: ReplicaHealth, head: HeadView | None, reading: Reading | None,
            error_rate: float) -> ReplicaHealth:
    """One health from the source's figures, the head's answer, the telemetry and the outcomes: not ok
    if any says so (with every reason), the worst of each figure."""
    reasons = []
    if not stated.ok:
        reasons.append(stated.reason or "marked unhealthy by its source")
    if head is None:
        reasons.append("its head has not answered yet")
    elif not head.ok:
        reasons.append(head.reason or "its pipeline is not serving")
    live = reading.health if reading is not None else ReplicaHealth()
    if not live.ok:
        reasons.append(live.reason)
    return ReplicaHealth(
        ok=not reasons,
        throttle=max(stated.throttle, live.throttle),
        memory_pressure=max(stated.memory_pressure, live.memory_pressure),
        error_rate=round(max(stated.error_rate, error_rate), 4),
        reason="; ".join(reasons),
    )


def _states_since(stages: dict[str, StageSample], head_ok_at: float, now: float) -> dict[str, StageSample]:
    """The stage samples with each state the head's later "ok" supersedes left out: the head says so only
    once every stage answered since the pipeline broke and each link is up, so a stage reported
    ``starting`` before that is up now. The state comes with the agent's heartbeat (every second, read
    here every ``HEALTH_REFRESH_S``), so after an in-place handover the replica stayed unroutable for
    up to 1.5 s after its head served again (replacement_bench: 0.9 s). A state sampled after the
    answer still counts, as do the figures and the age of every sample."""
    return {key: replace(sample, state=None) if now - sample.age_s < head_ok_at else sample
            for key, sample in stages.items()}


class LiveHealth:
    """What the gateway knows of each replica beyond its own bookkeeping; one per ``Gateway``."""

    def __init__(self) -> None:
        self.heads: dict[str, HeadView] = {}
        self.readings: dict[str, Reading] = {}
        self.measured = MeasuredCosts(min_samples=int(gateway_setting("COSTS_MIN_SAMPLES")))
        self.telemetry: TelemetryView | None = None
        self._malformed: set[str] = set()  # replicas whose malformed prefix summary was logged

    @staticmethod
    def enabled() -> bool:
        return bool(gateway_setting("LIVE_TELEMETRY"))

    def head_answered(self, replica_id: str, stats: dict) -> None:
        reason = "" if stats.get("ok") else (stats.get("reason") or "its pipeline is not serving")
        summary, error = self._prefix_summary(replica_id, stats.get("prefix_cache"))
        self.heads[replica_id] = HeadView(bool(stats.get("ok")), reason, time.time(), stats, summary, error)

    def _prefix_summary(self, replica_id: str, raw: Any) -> tuple[PrefixSummary | None, str]:
        """The head's summary, or none and why: a malformed one routes as if nothing were cached there
        (the request is then prefilled in full, which is always correct), logged once until it mends."""
        if raw is None:
            return None, ""
        try:
            summary = PrefixSummary.from_json(raw)
        except ValueError as exc:
            if replica_id not in self._malformed:
                self._malformed.add(replica_id)
                log.warning("replica %s: %s; routed as if its head cached nothing", replica_id, exc)
            return None, str(exc)
        self._malformed.discard(replica_id)
        return summary, ""

    def head_ok(self, replica_id: str) -> bool:
        """Whether the replica's head said ok when last asked."""
        head = self.heads.get(replica_id)
        return head is not None and head.ok

    def head_failed(self, replica_id: str, reason: str) -> None:
        """No answer, or a request found the pipeline broken: unhealthy until the head answers ok."""
        previous = self.heads.get(replica_id) or HeadView(False, reason, time.time())
        self.heads[replica_id] = replace(previous, ok=False, reason=reason, at=time.time())

    def apply(self, state: ReplicaState, endpoint: ReplicaEndpoint, *, head_answer: bool = False) -> None:
        """Set the replica's health and costs from everything known now. ``head_answer``: the head's
        statistics just arrived, so its free KV and queue are compared with the bookkeeping of this
        moment (read later, they would count requests finished since as someone else's)."""
        replica_id, now = state.replica_id, time.time()
        reading = None
        head = self.heads.get(replica_id)
        if self.enabled() and endpoint.stages:
            view = self.telemetry or TelemetryView({}, {}, now)  # none read yet: nothing is known
            devices, stages = view.of(endpoint.stages, now=now)  # read up to HEALTH_REFRESH_S ago
            if head is not None and head.ok:
                stages = _states_since(stages, head.at, now)
            reading = replica_reading(endpoint.stages, devices, stages, stale_s=stale_after_s())
            self.readings[replica_id] = reading
            if reading.age_s is not None:
                self.measured.add(replica_id, endpoint.costs, at=now - reading.age_s, reading=reading)
        else:
            self.readings.pop(replica_id, None)
        health = compose(stated=self._stated(endpoint), head=head, reading=reading,
                         error_rate=recorder.error_rate(replica_id))
        fresh = head_answer and head is not None and head.ok
        state.observe(
            health=health,
            kv_tokens_free=head.kv_tokens_free if fresh else None,
            queue_depth=head.stats.get("queue_depth") if fresh else None,
            **({"prefix_summary": head.prefix_summary} if fresh else {}),
        )
        costs, factor = self.measured.costs(replica_id, endpoint.costs, now=now) if self.enabled() else (
            endpoint.costs, None)
        state.costs = costs
        state.costs_source = "measured" if factor is not None else endpoint.costs_source

    def _stated(self, endpoint: ReplicaEndpoint) -> ReplicaHealth:
        """The source's health, except for a replica handed over beside whose successor's head has not
        said ok here yet (it warms up first, worker_runtime/warm_up.py): that one serves on meanwhile,
        or each gateway would have no replica from the switch until its next poll of the successor."""
        if endpoint.successor is None or self.head_ok(endpoint.successor):
            return endpoint.health
        return replace(endpoint.health, ok=True, reason="")

    def forget(self, keep_ids: set[str]) -> None:
        for table in (self.heads, self.readings):
            for replica_id in set(table) - keep_ids:
                table.pop(replica_id, None)
        self._malformed &= keep_ids
        self.measured.forget(keep_ids)

    def describe(self, state: ReplicaState, endpoint: ReplicaEndpoint) -> dict:
        """Everything the router uses for this replica now: the ``router`` part of its statistics."""
        now = time.time()
        head = self.heads.get(state.replica_id)
        reading = self.readings.get(state.replica_id)
        factor, samples = self.measured.factor(state.replica_id, now=now)
        return {
            "in_flight": state.in_flight,
            "queued_tokens": state.queued_tokens,
            "running_tokens": state.running_tokens,
            "kv_free": state.kv_free,
            "kv_capacity": state.kv_capacity,
            "external_queued": state.external_queued,
            "healthy": state.health.ok,
            "reason": state.health.reason,
            "slowdown": round(state.health.slowdown, 4),
            "health": asdict(state.health),
            "costs": asdict(state.costs),
            "costs_source": state.costs_source,
            "planned_costs": {**asdict(endpoint.costs), "source": endpoint.costs_source},
            "calibration": {"factor": factor, "samples": samples, "min_samples": self.measured.min_samples},
            "head": None if head is None else {"ok": head.ok, "reason": head.reason,
                                              "age_s": round(now - head.at, 2),
                                              "queue_depth": head.stats.get("queue_depth"),
                                              "kv_tokens_free": head.kv_tokens_free},
            "prefix_cache": _describe_summary(state.prefix_summary, head),
            "telemetry": {
                "expected": bool(endpoint.stages) and self.enabled(),
                "stale_after_s": stale_after_s(),
                **(reading.as_dict() if reading is not None else {}),
            },
        }


def _describe_summary(summary: PrefixSummary | None, head: HeadView | None) -> dict:
    """The prefix summary the router uses for a replica: its chain, its filter's size and fill (the
    share of bits set: past about a half, false positives grow), or why there is none."""
    if summary is None:
        return {"reported": False, "error": head.prefix_error if head is not None else ""}
    bits = len(summary.bits) * 8
    set_bits = sum(byte.bit_count() for byte in summary.bits)
    return {"reported": True, "error": "", "seed": summary.seed, "block_size": summary.block_size,
            "bloom_bytes": len(summary.bits), "fill": round(set_bits / bits, 4) if bits else 0.0}
