"""The demand trigger of the rebalance policy: the load each gateway process publishes, kept as a
series in ``RebalanceState.demand``, decided by ``planning.demand.decide``, and the question a demand
change asks the planner (one replica more or fewer) with its prediction against the targets.

The gateway's request records live in the memory of the process that served them, and the policy runs
in the Celery worker: each gateway process publishes, at most every ``PUBLISH_EVERY_S``, a load sample
per deployment it served into the shared cache (``sample_publish``, called by the gateway), and a pass
reads the samples of every process (``samples_read``) and adds them up.
"""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.cache import cache

from controlplane.deployments.degrade import workload_of
from controlplane.deployments.models import Deployment
from controlplane.planning import demand as policy
from controlplane.rebalance.models import RebalanceProposal, RebalanceState
from controlplane.rebalance.triggers import Occurrence

PUBLISH_EVERY_S = 5.0
SAMPLE_TTL_S = 120  # a process that stopped publishing stops counting after this
HORIZON_S = 120.0  # how far ahead the load is forecast at most: about the time a new replica takes to serve
SERIES_KEEP = 60  # samples kept per deployment (a pass every 10 s: ten minutes)


def _key(deployment_id: int, process: str) -> str:
    return f"rebalance:demand:{deployment_id}:{process}"


def _processes_key(deployment_id: int) -> str:
    return f"rebalance:demand:{deployment_id}:processes"


def sample_publish(*, deployment_id: int, process: str, sample: dict[str, Any]) -> None:
    """One gateway process's load of one deployment (``LoadSample`` fields, p95 and p99 of TTFT and
    TPOT as ``ttft_p95_ms`` ...), for the policy's next pass."""
    cache.set(_key(deployment_id, process), sample, SAMPLE_TTL_S)
    processes = set(cache.get(_processes_key(deployment_id)) or ()) | {process}
    cache.set(_processes_key(deployment_id), sorted(processes), SAMPLE_TTL_S)


def samples_read(*, deployment: Deployment, now: float) -> policy.LoadSample | None:
    """The deployment's load now over every publishing process: rates add up, the worst percentile
    of the target's kind counts. None when no process published lately."""
    found = [s for p in cache.get(_processes_key(deployment.pk)) or ()
             if (s := cache.get(_key(deployment.pk, p))) and now - s["at"] <= SAMPLE_TTL_S]
    if not found:
        return None
    q = deployment.target_percentile
    concurrency = [s["concurrency"] for s in found if s.get("concurrency") is not None]

    def worst(kind: str) -> float | None:
        values = [s[f"{kind}_p{q}_ms"] for s in found if s.get(f"{kind}_p{q}_ms") is not None]
        return max(values) if values else None

    return policy.LoadSample(at=now, arrival_rate=sum(s["arrival_rate"] for s in found),
                             output_tokens_per_s=sum(s["output_tokens_per_s"] for s in found),
                             ttft_ms=worst("ttft"), tpot_ms=worst("tpot"),
                             concurrency=sum(concurrency) if concurrency else None)


def targets(deployment: Deployment) -> policy.Targets:
    return policy.Targets(ttft_ms=deployment.ttft_target_ms, tpot_ms=deployment.tpot_target_ms,
                          percentile=deployment.target_percentile, min_replicas=deployment.min_replicas,
                          max_replicas=deployment.max_replicas)


def knobs() -> policy.Knobs:
    return policy.Knobs(high=settings.MOTLEY_REBALANCE_DEMAND_HIGH, low=settings.MOTLEY_REBALANCE_DEMAND_LOW,
                        for_s=settings.MOTLEY_REBALANCE_DRIFT_FOR_S,
                        cooldown_s=settings.MOTLEY_REBALANCE_COOLDOWN_S, horizon_s=HORIZON_S)


def capacity_of(plan: dict[str, Any]) -> policy.Capacity:
    """The planner's figures of a stored plan (``plan_to_dict``)."""
    figures = plan["predicted"]
    return policy.Capacity(replicas=len(plan["replicas"]), tokens_per_s=figures["decode_tokens_per_s"],
                           token_latency_ms=figures["token_latency_ms"], prefill_ms=figures["prefill_ms"],
                           slots=len(plan["replicas"]) * plan["batch"])


def demand(*, state: RebalanceState, deployment: Deployment, now: float) -> Occurrence | None:
    """Record this pass's load and decide on the series: an occurrence when a scale-out or a scale-in
    is due (lasted long enough, out of the cooldown, within the replica bounds)."""
    kept = state.demand.get("series", [])
    sample = samples_read(deployment=deployment, now=now)
    applied_at = deployment.revision.applied_at
    if sample is not None:
        # A percentile over a window that began before the applied change measures the plan it replaced:
        # counted, a miss the change already answered would ask for one more, pass after pass.
        window = settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S
        stale = applied_at is not None and sample.at - applied_at.timestamp() < window
        kept = [*kept, [sample.at, sample.arrival_rate, sample.output_tokens_per_s,
                        None if stale else sample.ttft_ms, None if stale else sample.tpot_ms,
                        sample.concurrency]]
    kept = [s for s in kept if now - s[0] <= deployment.target_window_s][-SERIES_KEEP:]
    memory = policy.Memory(**state.demand.get("memory", {}))
    # A degraded plan is the restore's to change (degrade.py): demand waits for the full plan.
    if not kept or deployment.revision.plan.get("predicted") is None or deployment.revision.degraded_from:
        state.demand = {"series": kept}
        return None
    decision = policy.decide([policy.LoadSample(*s) for s in kept], targets=targets(deployment),
                             capacity=capacity_of(deployment.revision.plan), memory=memory, now=now,
                             last_change_at=applied_at.timestamp() if applied_at else None, knobs=knobs())
    state.demand = {"series": kept, "memory": vars(decision.memory)}
    if decision.action is None:
        return None
    since = decision.memory.at_risk_since if decision.action == "out" else decision.memory.low_since
    load = decision.forecast
    detail = {"action": decision.action, "replicas": decision.replicas,
              "utilisation": _round(decision.utilisation),
              "horizon_s": round(decision.reach_s, 1), "forecast_requests_per_s": round(load.arrival_rate, 3),
              "forecast_output_tokens_per_s": round(load.output_tokens_per_s, 3),
              "forecast_concurrency": round(load.concurrency, 2)}
    key = f"demand:{decision.action}@{since:.0f}"
    return Occurrence(RebalanceProposal.Trigger.DEMAND, key, decision.reason, detail)


def asks(*, deployment: Deployment, occurrence: Occurrence, free_cards: int) -> list[dict[str, Any]]:
    """The changes to the revision's request a demand occurrence asks the planner for, in order: one
    replica fewer; or the replicas the policy wants (within ``max_replicas``, and as many as the
    ``free_cards`` hold at the cards a replica has now), else one more; else, where no free cards take
    one more, twice the batch on the replicas it has (more sequences in flight: more micro-batches and
    KV, if their memory holds it)."""
    placements = deployment.revision.placements
    current = len(placements)
    if occurrence.detail["action"] == "in":
        return [{"replicas": current - 1}]
    batch, _ = workload_of(deployment.revision.request)
    larger = {"replicas": current, "batch": 2 * batch}
    most = deployment.max_replicas
    if (most is not None and current >= most) or free_cards == 0:
        return [larger]
    held = free_cards // max(len(replica) for replica in placements)
    wanted = min(occurrence.detail["replicas"], current + max(1, held))  # decide: within max_replicas
    return [{"replicas": n} for n in dict.fromkeys((wanted, current + 1))] + [larger]


def delivers(plan: dict[str, Any], changes: dict[str, Any]) -> bool:
    """Whether the planner's plan is what ``changes`` asked for (the planner may serve fewer replicas
    than asked where the cards do not take more)."""
    return all(len(plan["replicas"]) == value if key == "replicas" else plan.get(key) == value
               for key, value in changes.items())


def asks_text(asks: list[dict[str, Any]]) -> str:
    return "; ".join(", ".join(f"{key} {value}" for key, value in changes.items()) for changes in asks)


def prediction(*, deployment: Deployment, occurrence: Occurrence, plan: dict[str, Any]) -> dict[str, Any]:
    """The proposed plan's figures at the forecast load against the targets (``planning.demand.predict``)."""
    load = policy.Forecast(occurrence.detail["forecast_requests_per_s"],
                           occurrence.detail["forecast_output_tokens_per_s"])
    capacity = capacity_of(plan)
    predicted = policy.predict(capacity, load, targets(deployment))
    return {"replicas": capacity.replicas, "capacity_tokens_per_s": round(capacity.tokens_per_s, 2),
            "forecast_output_tokens_per_s": round(load.output_tokens_per_s, 2),
            "forecast_requests_per_s": round(load.arrival_rate, 3),
            "horizon_s": occurrence.detail["horizon_s"],
            "ttft_target_ms": deployment.ttft_target_ms, "tpot_target_ms": deployment.tpot_target_ms,
            **predicted.as_dict()}


def prediction_text(figures: dict[str, Any]) -> str:
    """``prediction`` in words, with its numbers."""

    def ms(value: float | None) -> str:
        return "unbounded (over capacity)" if value is None else f"{value:.0f} ms"

    def target(value: int | None) -> str:
        return "no target" if value is None else f"target {value} ms"

    verdict = "meets" if figures["meets"] else "does not meet"
    share = "no capacity" if figures["utilisation"] is None else f"{figures['utilisation']:.0%}"
    return (f"with {figures['replicas']} replica(s) the plan serves {figures['capacity_tokens_per_s']:.1f} "
            f"tokens/s against {figures['forecast_output_tokens_per_s']:.1f} forecast "
            f"({share}); predicted TTFT p{figures['percentile']} {ms(figures['ttft_ms'])} "
            f"({target(figures['ttft_target_ms'])}), TPOT p{figures['percentile']} {ms(figures['tpot_ms'])} "
            f"({target(figures['tpot_target_ms'])}): it {verdict} the targets")


def _round(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 4)
