"""The served models from the deployment controller: every deployment that exists and is not being
stopped (pending, deploying, ready, degraded, failed), with its ready replicas, as ``ServedModel`` /
``ReplicaEndpoint`` (directory.py). ``served_models`` (the gateway's default source) uses them unless
a models file is configured.

A model whose deployments have no routable replica (ready, and ``serving``: not being handed over by
the controller) is still served, with no replica and a ``reason`` ("deployment d1 is deploying plan
revision 3"): its requests wait for one instead of getting a 404 (waiting.py), unless none is coming
(``cannot_serve``: every deployment of it failed, or lost a node and found no plan that fits), when
they get their 503 at once. A replica the
controller is handing over (``PipelineHead.serving`` False) stays listed, stated unhealthy, so the
requests it still runs keep their client and booking while nothing new is admitted to it; one handed
over beside names its ``successor``, and takes requests until the gateway heard that one say ok.

A model is served under its catalog name; replicas of several deployments of one model are routed
together, with the routing strategy of the oldest of them (``Deployment.routing_strategy``).
A replica's costs are its plan's predictions: the predicted per-token latency as ``decode_step_s``
(at the planned batch, so it already holds the batch's share) and the predicted prefill over the
planned prompt as ``prefill_s_per_token``; a replica whose plan predicts no latency gets
``ASSUMED_COSTS``. The gateway scales them by measured / predicted once the stages report step
times (live_health.py). A replica's KV capacity is the smallest ``kv_tokens`` its stages were started
with (what its head holds), else its plan's; its ``stages`` say where each stage runs (stage key,
device, planned step time), for the telemetry.
"""

from __future__ import annotations

from controlplane.deployments.models import Deployment
from controlplane.deployments.selectors import deployment_cannot_serve, deployment_endpoints, deployment_list
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.routing import ReplicaCosts, ReplicaHealth, StageLink
from controlplane.gateway.serving.directory import (
    ASSUMED_COSTS,
    ReplicaEndpoint,
    ServedModel,
    served_models_from_file,
)
from controlplane.planning import Plan

LISTED = (Deployment.Status.PENDING, Deployment.Status.DEPLOYING, Deployment.Status.READY,
          Deployment.Status.DEGRADED, Deployment.Status.FAILED)


def _planned(
    plan: Plan | None, plan_replica: int
) -> tuple[int | None, ReplicaCosts | None, list[float | None]]:
    """The plan replica's KV capacity, predicted costs (None: no prediction, as for a plan an operator
    edited) and stages' predicted step ms."""
    if plan is None or plan_replica >= len(plan.replicas):
        return None, None, []
    planned = plan.replicas[plan_replica]
    kv = min((s.kv_tokens for s in planned.stages if s.kv_tokens), default=None)
    step_ms = [s.step_ms or None for s in planned.stages]
    latency_ms, prefill_ms = planned.predicted.token_latency_ms, planned.predicted.prefill_ms
    if not latency_ms:
        return kv, None, step_ms
    prompt = max(1, (plan.context or 2) // 2)
    costs = ReplicaCosts(
        prefill_s_per_token=(prefill_ms or 0.0) / 1000 / prompt,
        decode_s_per_token=0.0,
        decode_step_s=latency_ms / 1000,
    )
    return kv, costs, step_ms


def _no_replica_reason(deployment: Deployment, handing_over: bool) -> str:
    """Why the deployment has no routable replica now, for the 503 a request gets after its wait."""
    number = deployment.revision.number if deployment.revision else None
    revision = f"plan revision {number}" if number else "its plan"
    status = deployment.status
    if status == Deployment.Status.DEPLOYING:
        why = f"deployment {deployment.name} is deploying {revision}"
    elif status == Deployment.Status.PENDING:
        why = f"deployment {deployment.name} is waiting to deploy {revision}"
    elif status == Deployment.Status.FAILED:
        why = f"deployment {deployment.name} failed"
    elif handing_over:
        why = f"deployment {deployment.name} is handing its replicas over to {revision}"
    else:
        why = f"deployment {deployment.name} ({status}) has no ready replica"
    return f"{why}: {deployment.status_message}" if deployment.status_message else why


def _handover_health(deployment: Deployment) -> ReplicaHealth:
    return ReplicaHealth(ok=False, reason=f"deployment {deployment.name} is handing this replica over")


def served_models_from_deployments() -> list[ServedModel]:
    by_model: dict[str, ServedModel] = {}
    deployments = deployment_list().filter(status__in=LISTED, stop_requested=False).order_by("pk")
    for deployment in deployments:
        plan = deployment.revision.priced if deployment.revision else None
        replicas = []
        for endpoint in deployment_endpoints(deployment=deployment):
            if not endpoint.ready:
                continue
            kv, costs, step_ms = _planned(plan, endpoint.plan_replica)
            stages = tuple(
                StageLink(s.stage_key, s.device,
                          step_ms[s.stage_index] if s.stage_index < len(step_ms) else None)
                for s in endpoint.stages
            )
            replicas.append(ReplicaEndpoint(
                pipeline_id=endpoint.pipeline_id, head_address=endpoint.head_address,
                auth_token=endpoint.auth_token, kv_tokens=endpoint.kv_tokens or kv,
                costs=costs or ASSUMED_COSTS,
                costs_source="planned" if costs else "assumed", stages=stages,
                health=ReplicaHealth() if endpoint.serving else _handover_health(deployment),
                successor=endpoint.successor,
            ))
        routable = any(r.health.ok for r in replicas)
        reason = "" if routable else _no_replica_reason(deployment, handing_over=bool(replicas))
        cannot_serve = not routable and deployment_cannot_serve(deployment=deployment)
        model = deployment.model
        previous = by_model.get(model.name)
        by_model[model.name] = ServedModel(
            name=model.name, tokenizer_path=model.path,
            replicas=(previous.replicas if previous else ()) + tuple(replicas),
            strategy=previous.strategy if previous else deployment.routing_strategy,
            reason="; ".join(r for r in (previous.reason if previous else "", reason) if r),
            cannot_serve=cannot_serve and (previous.cannot_serve if previous else True),
        )
    return list(by_model.values())


def served_models() -> list[ServedModel]:
    """The default source: the models file when one is set (tests, benchmarks, a fixed setup),
    else the controller's live deployments."""
    return served_models_from_file() if gateway_setting("MODELS_FILE") else served_models_from_deployments()
