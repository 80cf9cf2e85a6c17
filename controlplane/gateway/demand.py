"""A deployment's demand signals: how much it is asked to serve, and how well it meets its targets.

Read from what is already measured, nothing new is recorded: the gateway's record of each request
(``gateway.serving.decision_log``: when it was routed, to which pipeline, how long it waited in the
gateway, its time to first token and end, its prompt and output tokens) and the stages' telemetry (KV
use, the head's queue). Each gateway process keeps its most recent ``RECENT`` records; behind a load
balancer (service mode) every process also publishes the ones that ended to the shared store
(``serving.fleet_store``, the last ``DECISIONS_KEPT`` of all processes), so whichever process answers
counts every process's requests: its own records and the others' published ones. Requests still
running on another process are not published: ``queue.waiting`` is this process's. Where the kept
records cover less than the window (a rate above what is kept), the window is cut to the span every
source covers (``covered_s``) and the rates are over that span.

Per request: TTFT is the wait in the gateway plus the time from being routed to the first token (what
the client waited); TPOT is the time from the first token to the last over the tokens after the first.
Attainment is the share of the window's requests within each target, and ``overall`` the share of the
requests that ended (completed or failed; cancelled ones are the client's choice and left out) that
completed within every target set; a failed request counts as missed. Percentiles are nearest-rank.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from redis.exceptions import RedisError

from contracts.names import parse_pipeline_id
from controlplane.deployments.models import Deployment
from controlplane.gateway.serving.decision_log import RouteRecord, recorder
from controlplane.gateway.serving.fleet_store import (
    DECISIONS_KEPT,
    FleetStore,
    installation_prefix,
    process_id,
    shared_url,
)
from controlplane.rebalance.demand import PUBLISH_EVERY_S, sample_publish
from controlplane.telemetry.selectors import Latest, stage_samples

logger = logging.getLogger(__name__)
_published_at = 0.0  # when this process last published its load for the rebalance policy


def deployment_demand(*, deployment: Deployment, window_s: int | None = None, now: float | None = None,
                      records: Iterable[RouteRecord] | None = None) -> dict[str, Any]:
    """The demand signals of ``deployment`` over the last ``window_s`` seconds (default its
    ``target_window_s``): rates, queue, KV use, and TTFT and TPOT against its targets.

    ``records``: the gateway's request records to read (default this process's ``recorder``)."""
    now = time.time() if now is None else now
    window_s = window_s or deployment.target_window_s
    kept, covered_from = gateway_records() if records is None else (list(records), None)
    covered_s = window_s if covered_from is None else min(window_s, now - covered_from)
    mine = [r for r in kept if r.replica is not None and _deployment_of(r.replica) == deployment.pk]
    recent = [r for r in mine if now - r.at <= covered_s]
    span = max(covered_s, 1e-9)
    ttft_ms = [_ttft_ms(r) for r in recent if r.queue_s is not None]
    tpot_ms = [tpot for r in recent if (tpot := _tpot_ms(r)) is not None]
    ended = [r for r in recent if r.outcome == "completed" or r.outcome.startswith("failed")]
    percentile = deployment.target_percentile
    stages = [sample for sample in stage_samples(deployment_id=deployment.pk).values() if not sample.stale()]
    return {
        "deployment": deployment.pk, "at": now, "window_s": window_s, "covered_s": round(covered_s, 3),
        "requests": len(recent), "completed": sum(r.outcome == "completed" for r in recent),
        "failed": sum(r.outcome.startswith("failed") for r in recent),
        "arrival_rate": round(len(recent) / span, 4),
        "prompt_tokens_per_s": round(sum(r.prompt_tokens for r in recent) / span, 3),
        "output_tokens_per_s": round(sum(r.completion_tokens for r in recent) / span, 3),
        "queue": _queue(mine, recent, stages),
        "kv": _kv(stages),
        "ttft": _against(ttft_ms, deployment.ttft_target_ms, percentile),
        "tpot": _against(tpot_ms, deployment.tpot_target_ms, percentile),
        "overall": _overall(ended, deployment),
    }


def gateway_records() -> tuple[list[RouteRecord], float | None]:
    """This process's request records and the ended ones the other gateway processes published, and
    since when all of them are complete (None: as far back as any window: no source was cut)."""
    own = list(recorder.recent)
    starts = [own[0].at] if len(own) == recorder.recent.maxlen else []
    if (store := _shared_store()) is None:  # one process: it knows nothing from before it started
        return own, max([*starts, recorder.started_at])
    try:
        published = store.ended_decisions()
    except (RedisError, OSError) as exc:  # each process's own figures until the store answers again
        logger.warning("the other gateway processes' requests are unreachable: %s", exc)
        return own, max(starts, default=None)
    if len(published) >= DECISIONS_KEPT:
        starts.append(published[0]["at"])
    me = process_id()
    others = [RouteRecord(**record) for record in published if record["process"] != me]
    return own + others, max(starts, default=None)


@functools.cache
def _store_at(url: str, prefix: str) -> FleetStore:
    return FleetStore(url, prefix=prefix)


def _shared_store() -> FleetStore | None:
    url = shared_url()
    return None if url is None else _store_at(url, installation_prefix())


def demand_publish_due(now: float) -> bool:
    """Whether this process's load is due for publishing (at most every ``PUBLISH_EVERY_S``); claims
    the turn when it is."""
    global _published_at
    if now - _published_at < PUBLISH_EVERY_S:
        return False
    _published_at = now
    return True


def demand_publish(*, now: float, records: Iterable[RouteRecord] | None = None,
                   started_at: float | None = None, waiting: dict[str, int] | None = None) -> None:
    """Publish, for the rebalance policy in the Celery worker, the load of every deployment this
    process served over the last ``MOTLEY_REBALANCE_DEMAND_WINDOW_S``: rates, and p95 and p99 of TTFT
    and TPOT (``rebalance.demand.sample_publish``). No DB access: called off the event loop after a
    request. Lossy like telemetry: a cache that does not answer loses this sample, the next one follows.

    The rates are over the part of the window the process saw: since it started (``started_at``; the
    recorder's by default), or since its oldest kept record where it keeps no older one. Over the
    whole window, a process that has served 5 s of a 60 s window would report a twelfth of its load.

    ``concurrency``: the requests a replica held, on average over that span (each from being routed to
    its end), plus those of the deployment's model waiting in this process's queue now (``waiting``, by
    served model name; shared evenly where several deployments serve one model). A replica's real
    time per request, the gateway's own included, and the load a saturated plan cannot take in: what
    the served tokens/s cannot show (planning/demand.py)."""
    window = settings.MOTLEY_REBALANCE_DEMAND_WINDOW_S
    kept = list(recorder.recent if records is None else records)
    started_at = recorder.started_at if records is None else started_at
    since = [now - window, *([started_at] if started_at is not None else []),
             *([kept[0].at] if records is None and len(kept) == recorder.recent.maxlen else [])]
    span = max(now - max(since), 1.0)  # a second at least: one request is no rate of thousands
    recent = [r for r in kept if r.replica is not None and now - r.at <= window]
    by_deployment: dict[int, list[RouteRecord]] = {}
    for record in recent:
        if (deployment := _deployment_of(record.replica)) is not None:
            by_deployment.setdefault(deployment, []).append(record)
    held = _held_s(kept, since=now - span, now=now)
    models = {deployment: mine[-1].model for deployment, mine in by_deployment.items()}
    sharing = Counter(models.values())
    for deployment, mine in by_deployment.items():
        queued = (waiting or {}).get(models[deployment], 0) / sharing[models[deployment]]
        ttft = [_ttft_ms(r) for r in mine if r.queue_s is not None]
        tpot = [v for r in mine if (v := _tpot_ms(r)) is not None]
        try:
            sample_publish(deployment_id=deployment, process=process_id(), sample={
                "at": now, "arrival_rate": len(mine) / span,
                "output_tokens_per_s": sum(r.completion_tokens for r in mine) / span,
                "concurrency": held.get(deployment, 0.0) / span + queued,
                **{f"{kind}_p{q}_ms": percentile_of(values, q)
                   for kind, values in (("ttft", ttft), ("tpot", tpot)) for q in (95, 99)}})
        except Exception as exc:  # the cache is down: the policy sees no load, as with no requests
            logger.warning("demand of deployment %s not published: %s", deployment, exc)


def _held_s(records: list[RouteRecord], *, since: float, now: float) -> dict[int, float]:
    """Per deployment, the seconds its replicas held requests between ``since`` and ``now``: each
    record from being routed to its end (now, while it runs)."""
    held: dict[int, float] = {}
    for record in records:
        if record.replica is None or (deployment := _deployment_of(record.replica)) is None:
            continue
        end = now if record.e2e_s is None else record.at + record.e2e_s
        if (overlap := min(end, now) - max(record.at, since)) > 0:
            held[deployment] = held.get(deployment, 0.0) + overlap
    return held


def _deployment_of(replica: str) -> int | None:
    parsed = parse_pipeline_id(replica)
    return parsed[0] if parsed else None


def _ttft_ms(record: RouteRecord) -> float:
    return (record.waited_s + record.queue_s) * 1000


def _tpot_ms(record: RouteRecord) -> float | None:
    """Completed requests of more than one token only: a single token has no time per output token."""
    if record.outcome != "completed" or record.queue_s is None or record.e2e_s is None:
        return None
    if record.completion_tokens < 2:
        return None
    return max(0.0, record.e2e_s - record.queue_s) * 1000 / (record.completion_tokens - 1)


def percentile_of(values: list[float], q: int) -> float | None:
    """The nearest-rank ``q``-th percentile: the smallest value at least q % of the values reach."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _against(values: list[float], target_ms: int | None, percentile: int) -> dict[str, Any]:
    p95, p99 = percentile_of(values, 95), percentile_of(values, 99)
    measured = p95 if percentile == 95 else p99
    within = sum(v <= target_ms for v in values) / len(values) if target_ms and values else None
    return {
        "target_ms": target_ms, "percentile": percentile, "samples": len(values),
        "p95_ms": _ms(p95), "p99_ms": _ms(p99), "attainment": _share(within),
        "met": None if target_ms is None or measured is None else measured <= target_ms,
    }


def _overall(ended: list[RouteRecord], deployment: Deployment) -> dict[str, Any]:
    """The share of ended requests that completed within every target set (None: no target or none ended)."""
    ttft, tpot = deployment.ttft_target_ms, deployment.tpot_target_ms
    if not ended or (ttft is None and tpot is None):
        return {"ended": len(ended), "attainment": None}

    def within(record: RouteRecord) -> bool:
        if record.outcome != "completed" or record.queue_s is None:
            return False
        per_token = _tpot_ms(record)
        return ((ttft is None or _ttft_ms(record) <= ttft)
                and (tpot is None or per_token is None or per_token <= tpot))

    return {"ended": len(ended), "attainment": _share(sum(map(within, ended)) / len(ended))}


def _queue(mine: list[RouteRecord], recent: list[RouteRecord], stages: list[Latest]) -> dict[str, Any]:
    """Requests sent to its pipelines without a first token yet (vLLM's ``num_requests_waiting``), the
    heads' own queues from telemetry, and how long the window's requests waited in the gateway."""
    waits = [r.waited_s * 1000 for r in recent]
    heads = [sample.value.get("stats") or {} for sample in stages if sample.value.get("stage_index") == 0]
    depths = [stats["queue_depth"] for stats in heads if isinstance(stats.get("queue_depth"), (int, float))]
    return {
        "waiting": sum(r.outcome == "running" and r.queue_s is None for r in mine),
        "head_queue": sum(depths) if depths else None,
        "wait_mean_ms": _ms(sum(waits) / len(waits)) if waits else None,
        "wait_p95_ms": _ms(percentile_of(waits, 95)),
    }


def _kv(stages: list[Latest]) -> dict[str, Any]:
    """KV use of its stages from their latest telemetry: the fullest stage's share (the one that limits
    how many sequences its pipeline admits) and the tokens used and free over all of them."""
    used = free = 0
    fullest = None
    for sample in stages:
        stats = sample.value.get("stats") or {}
        if not isinstance(stats.get("kv_tokens_used"), (int, float)):
            continue
        stage_used, stage_free = stats["kv_tokens_used"], stats.get("kv_tokens_free") or 0
        used, free = used + stage_used, free + stage_free
        if stage_used + stage_free:
            fullest = max(fullest or 0.0, stage_used / (stage_used + stage_free))
    return {"use": _share(fullest), "used_tokens": used, "free_tokens": free}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
