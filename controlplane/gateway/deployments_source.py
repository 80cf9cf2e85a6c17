"""The served models from the deployment controller: each READY (or DEGRADED) deployment's ready
replicas, as ``ServedModel`` / ``ReplicaEndpoint`` (directory.py). ``served_models`` (the gateway's
default source) uses them unless a models file is configured.

A model is served under its catalog name; replicas of several deployments of one model are routed
together, with the routing strategy of the oldest of them (``Deployment.routing_strategy``).
A replica's costs are its plan's predictions: the predicted per-token latency as ``decode_step_s``
(at the planned batch, so it already holds the batch's share) and the predicted prefill over the
planned prompt as ``prefill_s_per_token``; a replica whose plan predicts no latency gets
``ASSUMED_COSTS``. The gateway scales them by measured / predicted once the stages report step
times (live_health.py). A replica's KV capacity is its smallest stage's planned ``kv_tokens``; its
``stages`` say where each stage runs (stage key, device, planned step time), for the telemetry.
"""

from __future__ import annotations

from controlplane.deployments.models import Deployment
from controlplane.deployments.selectors import deployment_endpoints, deployment_list
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.directory import (
    ASSUMED_COSTS,
    ReplicaEndpoint,
    ServedModel,
    served_models_from_file,
)
from controlplane.gateway.routing import ReplicaCosts, StageLink


def _planned(plan: dict, replica: int) -> tuple[int | None, ReplicaCosts | None, list[float | None]]:
    """The replica's KV capacity, predicted costs (None: no prediction) and stages' predicted step ms."""
    replicas = plan.get("replicas") or []
    if replica >= len(replicas):
        return None, None, []
    planned = replicas[replica]
    stages = planned.get("stages", [])
    kv = min((s["kv_tokens"] for s in stages if s.get("kv_tokens")), default=None)
    step_ms = [(s.get("predicted") or {}).get("step_ms") or None for s in stages]
    predicted = planned.get("predicted") or {}
    latency_ms, prefill_ms = predicted.get("token_latency_ms"), predicted.get("prefill_ms")
    if not latency_ms:
        return kv, None, step_ms
    prompt = plan.get("prompt_tokens") or max(1, (plan.get("context") or 2) // 2)
    costs = ReplicaCosts(
        prefill_s_per_token=(prefill_ms or 0.0) / 1000 / prompt,
        decode_s_per_token=0.0,
        decode_step_s=latency_ms / 1000,
    )
    return kv, costs, step_ms


def served_models_from_deployments() -> list[ServedModel]:
    live = (Deployment.Status.READY, Deployment.Status.DEGRADED)
    by_model: dict[str, ServedModel] = {}
    for deployment in deployment_list().filter(status__in=live).order_by("pk"):
        plan = deployment.revision.plan if deployment.revision else {}
        replicas = []
        for endpoint in deployment_endpoints(deployment=deployment):
            if not endpoint.ready:
                continue
            kv, costs, step_ms = _planned(plan, endpoint.replica)
            stages = tuple(
                StageLink(s.stage_key, s.device, step_ms[s.stage_index] if s.stage_index < len(step_ms) else None)
                for s in endpoint.stages
            )
            replicas.append(ReplicaEndpoint(
                pipeline_id=endpoint.pipeline_id, head_address=endpoint.head_address,
                auth_token=endpoint.auth_token, kv_tokens=kv, costs=costs or ASSUMED_COSTS,
                costs_source="planned" if costs else "assumed", stages=stages,
            ))
        model = deployment.model
        previous = by_model.get(model.name)
        by_model[model.name] = ServedModel(
            name=model.name, tokenizer_path=model.path,
            replicas=(previous.replicas if previous else ()) + tuple(replicas),
            strategy=previous.strategy if previous else deployment.routing_strategy,
        )
    return [served for served in by_model.values() if served.replicas]


def served_models() -> list[ServedModel]:
    """The default source: the models file when one is set (tests, benchmarks, a fixed setup),
    else the controller's live deployments."""
    return served_models_from_file() if gateway_setting("MODELS_FILE") else served_models_from_deployments()
