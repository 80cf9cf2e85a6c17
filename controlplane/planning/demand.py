"""Demand in the rebalance policy: from a deployment's recorded load, whether to add a replica, take one
away, or keep what runs; and, before a change is proposed, whether the plan it would apply meets the
targets at the load forecast for when it runs.

Pure (no Django): the control plane feeds it the demand signals it samples each pass
(``gateway.demand``) and the planner's figures of a plan; the unit tests feed it recorded series.

The rules, in the order they are checked (docs/deployments.md, "Demand"):

- the load is forecast ``horizon_s`` ahead on a robust (Theil-Sen) line through the window's samples
  (arrival rate and output tokens/s), never below zero, so a rise is answered before it peaks and a
  few spikes do not tilt it (and no further ahead than half the span the samples cover: a trend
  through a few samples is mostly noise);
- the load is the larger of two shares of the plan's capacity: the output tokens/s served against the
  tokens/s the planner predicts, and the requests in the system (held by a replica, on average over the
  window, or waiting in the gateway now) against the sequences the replicas hold at once. The first
  trusts the planner; the second is Little's law on what was measured, so it counts what a replica
  really spends per request (the gateway's own time included) and the demand a saturated replica
  cannot serve (the backlog), which the served tokens/s never show;
- **at risk**: the forecast needs more than ``high`` of the plan's capacity, or the measured
  percentile (the targets', p95 or p99) of TTFT or TPOT is over its target; **low**: one replica
  fewer would still run under ``low`` of its capacity at the forecast load, and every target is met.
  ``low`` < ``high`` is the hysteresis: a scale-in leaves a plan the same load does not push back out;
- a scale-out asks for as many replicas as bring the forecast back to ``high`` (Kubernetes' HPA rule,
  ``ceil(replicas * load / high)``), at least one more: a load that rises fast is answered in one
  change rather than one replica per cool-down; a scale-in takes one replica at a time;
- a condition acts only once it has lasted ``for_s`` (a noisy sample restarts the clock), and no
  change comes within ``cooldown_s`` of the last one;
- within ``min_replicas`` .. ``max_replicas``: at ``max_replicas`` a scale-out asks for more throughput
  from the replicas it has (the caller's alternative to another replica: a larger batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class LoadSample:
    """One pass's demand signals (``gateway.demand.deployment_demand``), at unix time ``at``."""

    at: float
    arrival_rate: float  # requests/s
    output_tokens_per_s: float
    ttft_ms: float | None = None  # the measured percentile the target is set at (None: no requests)
    tpot_ms: float | None = None
    concurrency: float | None = None  # requests held by replicas (mean over the window) + waiting now


@dataclass(frozen=True)
class Targets:
    ttft_ms: float | None
    tpot_ms: float | None
    percentile: int = 95  # the share of requests (in %) each target must hold for
    min_replicas: int = 1
    max_replicas: int | None = None


@dataclass(frozen=True)
class Capacity:
    """The planner's figures of a plan: decode tokens/s over all replicas, the time between two tokens of
    a sequence and a prompt's prefill, both at the plan's batch."""

    replicas: int
    tokens_per_s: float
    token_latency_ms: float
    prefill_ms: float
    slots: int = 0  # sequences the replicas hold at once (replicas x batch); 0: not known


@dataclass(frozen=True)
class Knobs:
    high: float = 0.8
    low: float = 0.5
    for_s: float = 60.0
    cooldown_s: float = 300.0
    horizon_s: float = 120.0


@dataclass(frozen=True)
class Forecast:
    arrival_rate: float
    output_tokens_per_s: float
    concurrency: float = 0.0

    @property
    def tokens_per_request(self) -> float:
        return self.output_tokens_per_s / self.arrival_rate if self.arrival_rate > 0 else 0.0


@dataclass(frozen=True)
class Prediction:
    """What a plan is predicted to give at a forecast load: TTFT and TPOT at the targets' percentile."""

    utilisation: float  # forecast output tokens/s over the plan's capacity
    percentile: int
    ttft_ms: float  # inf when the load exceeds the capacity
    tpot_ms: float
    meets: bool

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else round(v, 3) if isinstance(v, float)
                    else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Memory:
    """What the policy remembers between passes: since when each condition has lasted."""

    at_risk_since: float | None = None
    low_since: float | None = None


@dataclass(frozen=True)
class Decision:
    action: str | None  # "out", "in" or None (keep)
    reason: str
    replicas: int  # how many replicas the action asks for (the current count when it keeps)
    forecast: Forecast
    reach_s: float  # how far ahead the load was forecast
    utilisation: float
    memory: Memory


def forecast(series: Sequence[LoadSample], *, at: float) -> Forecast:
    """The load at time ``at`` on the Theil-Sen line through ``series`` (the median of the slopes
    between every two samples, through the median residual), floored at zero: a robust trend, which
    a few spikes in the window do not tilt as they would a least-squares line."""
    times = [s.at for s in series]
    measured = [s for s in series if s.concurrency is not None]
    return Forecast(_theil_sen(times, [s.arrival_rate for s in series], at),
                    _theil_sen(times, [s.output_tokens_per_s for s in series], at),
                    _theil_sen([s.at for s in measured], [s.concurrency for s in measured], at))


def _theil_sen(times: list[float], values: list[float], at: float) -> float:
    if not values:
        return 0.0
    slopes = [(values[j] - values[i]) / (times[j] - times[i])
              for i in range(len(times)) for j in range(i + 1, len(times)) if times[j] != times[i]]
    slope = _median(slopes) if slopes else 0.0
    level = _median([v - slope * t for t, v in zip(times, values, strict=True)])
    return max(0.0, level + slope * at)


def _median(values: list[float]) -> float:
    ordered, middle = sorted(values), len(values) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def predict(capacity: Capacity, load: Forecast, targets: Targets) -> Prediction:
    """TTFT and TPOT of ``capacity`` at ``load``, at the targets' percentile q.

    TPOT is the plan's token latency while the load fits its capacity. TTFT is a prefill plus the wait
    for a free sequence slot, the plan's replicas taken as one M/M/1 server whose service time is a
    request's output at the plan's full rate: its q-th percentile wait is ``S / (1 - u) * ln(u / m)``
    with ``m = 1 - q/100`` the share allowed over (zero while ``u`` <= m). Over capacity both are
    unbounded."""
    u = load.output_tokens_per_s / capacity.tokens_per_s if capacity.tokens_per_s > 0 else math.inf
    if u >= 1:
        ttft = tpot = math.inf
    else:
        service_ms = 1000 * load.tokens_per_request / capacity.tokens_per_s
        miss = 1 - targets.percentile / 100
        wait = service_ms / (1 - u) * math.log(u / miss) if u > miss else 0.0
        ttft, tpot = capacity.prefill_ms + wait, capacity.token_latency_ms
    meets = ((targets.ttft_ms is None or ttft <= targets.ttft_ms)
             and (targets.tpot_ms is None or tpot <= targets.tpot_ms))
    return Prediction(u, targets.percentile, ttft, tpot, meets)


def decide(series: Sequence[LoadSample], *, targets: Targets, capacity: Capacity, memory: Memory,
           now: float, last_change_at: float | None, knobs: Knobs) -> Decision:
    """Scale out, in, or keep ``capacity`` given the recorded ``series`` (oldest first)."""
    span = series[-1].at - series[0].at if series else 0.0
    reach = min(knobs.horizon_s, span / 2)  # a short series: a short reach
    load = forecast(series, at=now + reach)
    u = load.output_tokens_per_s / capacity.tokens_per_s if capacity.tokens_per_s > 0 else math.inf
    occupancy = load.concurrency / capacity.slots if capacity.slots > 0 else 0.0
    u = max(u, occupancy)
    latest = series[-1] if series else None
    missed = [f"{name} p{targets.percentile} {value:.0f} ms over its {target:g} ms target"
              for name, value, target in (("TTFT", latest and latest.ttft_ms, targets.ttft_ms),
                                          ("TPOT", latest and latest.tpot_ms, targets.tpot_ms))
              if value is not None and target is not None and value > target]
    n = capacity.replicas
    u_fewer = u * n / (n - 1) if n > 1 else math.inf
    at_risk = u > knobs.high or bool(missed)
    low = not missed and u_fewer < knobs.low
    memory = Memory(at_risk_since=_since(memory.at_risk_since, now) if at_risk else None,
                    low_since=_since(memory.low_since, now) if low else None)
    figures = (f"forecast {load.output_tokens_per_s:.1f} output tokens/s "
               f"({load.arrival_rate:.2f} requests/s) "
               f"in {reach:.0f} s against {capacity.tokens_per_s:.1f} tokens/s of {n} replica(s)")
    if capacity.slots > 0:
        figures += (f", {load.concurrency:.1f} requests in flight or waiting for {capacity.slots} "
                    f"sequence slots")
    figures += f": {u:.0%} of capacity"
    since = memory.at_risk_since if at_risk else memory.low_since
    action, wanted = None, n
    if at_risk:
        why = "; ".join(missed) if missed else f"over the {knobs.high:.0%} high mark"
        reason, action = f"targets at risk: {figures}; {why}", "out"
        most = targets.max_replicas if targets.max_replicas is not None else math.inf
        if n >= most:
            reason += f"; at max_replicas {targets.max_replicas}: more throughput from the replicas it has"
        else:
            wanted = int(min(most, max(n + 1, math.ceil(n * u / knobs.high) if math.isfinite(u) else n + 1)))
            reason += f"; asks for {wanted} replica(s)"
    elif low:
        reason = (f"load low: {figures}; {n - 1} replica(s) would run at {u_fewer:.0%}, under the "
                  f"{knobs.low:.0%} low mark")
        if n <= targets.min_replicas:
            reason += f"; already at min_replicas {targets.min_replicas}"
        else:
            action, wanted = "in", n - 1
    else:
        return Decision(None, f"load within bounds: {figures}", n, load, reach, u, memory)
    if action is not None and now - since < knobs.for_s:
        reason, action = f"{reason}; for {now - since:.0f} s of the {knobs.for_s:g} s it must last", None
    if action is not None and last_change_at is not None and now - last_change_at < knobs.cooldown_s:
        reason, action = (f"{reason}; waits: the last change was {now - last_change_at:.0f} s ago "
                          f"(cooldown {knobs.cooldown_s:g} s)"), None
    return Decision(action, reason, n if action is None else wanted, load, reach, u, memory)


def _since(began: float | None, now: float) -> float:
    return now if began is None else began
