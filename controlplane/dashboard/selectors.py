"""Reads the dashboard pages render from: the inventory shaped for drawing, in a few queries.

The pages embed these dicts as JSON for their first paint and the JS modules redraw from the same
shapes, so the server and the browser draw one picture.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.db.models import Count, Prefetch, Q

from contracts.hardware import GIB
from contracts.metrics import SLOWDOWN_REASONS
from contracts.names import device_name
from contracts.stage_spec import MAX_SPECULATIVE_TOKENS, SPECULATION_MODES
from controlplane.deployments.degrade import degraded_workload, precision_text
from controlplane.deployments.events import event_list
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentStage, PlanRevision
from controlplane.deployments.targets import targets_of
from controlplane.gateway.demand import deployment_demand
from controlplane.inventory.models import Device, Link, Node
from controlplane.models_catalog.models import LlmModel
from controlplane.models_catalog.selectors import model_profile
from controlplane.planning import PlanningError, StagePlan
from controlplane.planning.tensor_parallel import layout
from controlplane.telemetry.calibration import stage_calibration


def node_list() -> list[Node]:
    """Nodes with their device count, emulated-device count and total memory (one query)."""
    return list(
        Node.objects.annotate(
            device_count=Count("devices"),
            emulated_count=Count("devices", filter=Q(devices__emulated=True)),
        ).order_by("name")
    )


def device_list() -> list[Device]:
    return list(Device.objects.select_related("node").order_by("node__name", "index"))


def model_list() -> list[LlmModel]:
    return list(LlmModel.objects.defer("config", "profile").order_by("name"))


def topology() -> dict[str, Any]:
    """Nodes, their devices and every link to draw, declared or implied (three queries), and the
    throttle reasons that count as a slowdown (the fleet overview's "throttled").

    Links nobody declared still exist physically: devices of one NVLink island talk over NVLink
    (added here as ``implied``), and every node reaches the others through its network interface
    (drawn as the node's uplink to a shared switch, with ``network_gbps``), so the operator sees
    the graph the planner prices (``FleetSpec.link_between``) without 2,000 lines for 64 nodes.
    """
    nodes = Node.objects.prefetch_related("devices").order_by("name")
    declared = Link.objects.select_related("node_a", "node_b", "device_a__node", "device_b__node")
    links = [_link(link) for link in declared]
    pairs = {frozenset((link["a"], link["b"])) for link in links}
    node_rows = []
    for node in nodes:
        devices = sorted(node.devices.all(), key=lambda d: d.index)
        node_rows.append({
            "name": node.name, "status": node.liveness, "network_gbps": node.network_gbps,
            "address": node.address, "emulated": any(d.emulated for d in devices),
            "fleet": node.fleet, "labels": node.labels,
            "devices": [_device(node, d) for d in devices],
        })
        islands: dict[str, list[Device]] = {}
        for device in devices:
            if device.nvlink_island:
                islands.setdefault(device.nvlink_island, []).append(device)
        for members in islands.values():
            for a, b in zip(members, members[1:]):
                pair = frozenset((device_name(node.name, a.index), device_name(node.name, b.index)))
                if pair not in pairs:
                    pairs.add(pair)
                    links.append({"kind": "nvlink", "a": min(pair), "b": max(pair),
                                  "bandwidth_gbs": a.nvlink_bandwidth_gbs, "implied": True})
    return {"nodes": node_rows, "links": links, "deployments": deployment_overlay(),
            "slowdown_reasons": list(SLOWDOWN_REASONS)}


def _device(node: Node, device: Device) -> dict[str, Any]:
    return {
        "name": device_name(node.name, device.index), "index": device.index, "model": device.model_name,
        "memory_gib": round(device.memory_bytes / GIB, 1), "emulated": device.emulated,
        "health": device.shown_health, "island": device.nvlink_island,
        "down": node.is_down or device.health == Device.Health.UNHEALTHY,
    }


def _link(link: Link) -> dict[str, Any]:
    a, b = link.endpoints
    return {"kind": link.kind, "a": a.name, "b": b.name, "bandwidth_gbs": link.bandwidth_gbs,
            "implied": False}


def deployment_overview(*, events: int = 0, calibration: bool = False) -> list[dict[str, Any]]:
    """Every deployment with its revisions (newest first) and its stages, for the deployments page.

    With ``events``, each deployment's newest that many stored events too (``DeploymentEvent``, as
    the controller recorded them at each transition: docs/deployments.md, "Events"). Four queries
    (five with events) whatever the number of deployments. With ``calibration``, each wanted stage's
    decode step at the load it runs: predicted raw, calibrated, measured (``stage_calibration``; no
    query without fresh stage samples, six with).
    """
    prefetches = [
        Prefetch("revisions", queryset=PlanRevision.objects.order_by("-number", "-created")),
        Prefetch("stages", queryset=DeploymentStage.objects.select_related("node", "device__node")
                 .order_by("pipeline", "stage_index", "-wanted")),
    ]
    if events:
        newest = DeploymentEvent.objects.order_by("-at", "-id")[:events]
        prefetches.append(Prefetch("events", queryset=newest, to_attr="newest_events"))
    deployments = Deployment.objects.select_related("model", "revision").prefetch_related(*prefetches)
    figures = stage_calibration() if calibration else {}
    return [_deployment(d, figures) for d in deployments.order_by("name")]


def event_rows(events) -> list[dict[str, Any]]:
    """Events as the deployments page draws them (the shape of ``GET /api/v1/events/``'s items)."""
    return [{"at": e.at, "kind": e.kind, "kind_display": e.get_kind_display(), "message": e.message,
             "node": e.node, "device": e.device} for e in events]


def fleet_events(*, limit: int) -> list[dict[str, Any]]:
    """The newest events of no deployment: nodes suspect, lost, back, registered, draining (one query)."""
    return event_rows(event_list().filter(deployment__isnull=True)[:limit])


def _draft_models(deployment: Deployment) -> list[dict[str, Any]]:
    """The models that could draft for the deployment's: others with weights and its vocabulary."""
    vocab = deployment.model.config.get("vocab_size")
    return [{"id": m.pk, "name": m.name} for m in LlmModel.objects.filter(has_weights=True)
            .exclude(pk=deployment.model_id).order_by("name") if m.config.get("vocab_size") == vocab]


def _deployment(deployment: Deployment, figures: dict[str, dict] | None = None) -> dict[str, Any]:
    plan = deployment.revision.priced if deployment.revision else None  # None: no figures (an edited plan)
    predicted_stages = {(r, s): stage for r, replica in enumerate(plan.replicas if plan else ())
                        for s, stage in enumerate(replica.stages)}
    revisions = [(r, r.priced) for r in deployment.revisions.all()]
    return {
        "id": deployment.pk, "name": deployment.name, "model": deployment.model.name,
        "model_id": deployment.model_id,
        "status": deployment.status, "status_display": deployment.get_status_display(),
        "status_message": deployment.status_message, "prefix_caching": deployment.prefix_caching,
        "speculation": deployment.speculation, "speculative_tokens": deployment.speculative_tokens,
        "speculation_modes": SPECULATION_MODES, "max_speculative_tokens": MAX_SPECULATIVE_TOKENS,
        "draft_deployment": deployment.draft_deployment.name if deployment.draft_deployment else None,
        "draft_model_id": deployment.draft_deployment.model_id if deployment.draft_deployment else None,
        "draft_models": _draft_models(deployment),
        "revision_number": getattr(deployment.revision, "number", None),
        "degraded": _degraded(deployment.revision),
        "replicas": _replica_count(deployment.revision),
        "targets": targets_of(deployment), "demand": deployment_demand(deployment=deployment),
        "predicted": asdict(plan.predicted) if plan else None,
        "bottleneck": asdict(plan.bottleneck) if plan else None,
        "replica_bottlenecks": [r.bottleneck.device for r in plan.replicas] if plan else [],
        "revisions": [{"id": r.pk, "number": r.number, "source": r.get_source_display(), "status": r.status,
                       "created": r.created, "applied_at": r.applied_at,
                       "tokens_per_s": p.predicted.decode_tokens_per_s if p else None,
                       "latency_ms": p.predicted.token_latency_ms if p else None,
                       "bottleneck": p.bottleneck.device if p else None} for r, p in revisions],
        "stages": [{
            "stage_key": s.stage_key, "pipeline": s.pipeline, "plan_replica": s.plan_replica,
            "stage_index": s.stage_index, "wanted": s.wanted, "held": s.held,
            "node": s.node.name, "device": s.device.name if s.device else None,
            "layers": s.spec.get("layers"), "bits": s.spec.get("bits"), "low_bits": s.spec.get("low_bits"),
            "low_from": s.spec.get("low_from"), "state": s.state,
            "restarts": s.restarts, "message": s.message,
            "predicted_step_ms": _predicted_step_ms(predicted_stages, s) if s.wanted else None,
        } for s in deployment.stages.all()],
        "events": event_rows(getattr(deployment, "newest_events", ())),
        "calibration": [_calibration_row(s, (figures or {}).get(s.stage_key)) for s in deployment.stages.all()
                        if s.wanted],
    }


_FACTOR_SOURCES = {"model": "its GPU model's", "kind": "its kind's", "none": "not measured"}


def _calibration_row(stage: DeploymentStage, figures: dict | None) -> dict[str, Any]:
    """A stage's calibration figures as the page shows them (calibration.js draws the same)."""
    row = {"stage_key": stage.stage_key, "pipeline": stage.pipeline, "stage_index": stage.stage_index,
           "device": stage.device.name if stage.device else stage.node.name, **(figures or {})}
    if figures:
        why = f"{figures['samples']} samples" if figures["source"] == "measured" else _FACTOR_SOURCES.get(
            figures["source"], figures["source"])
        row["factor_label"] = f"×{figures['factor']:.2f} ({why})"
    return row


def _degraded(revision: PlanRevision | None) -> dict | None:
    """``degraded_workload`` with its lowered precision in words (``precision_text``, "" when none)."""
    shown = degraded_workload(revision) if revision else None
    return {**shown, "precision_text": precision_text(shown["precision"])} if shown else None


def _replica_count(revision: PlanRevision | None) -> int:
    try:
        return len(revision.placements) if revision else 0
    except PlanningError:  # a stored plan without readable replicas
        return 0


def _predicted_step_ms(predicted_stages: dict[tuple[int, int], StagePlan],
                       stage: DeploymentStage) -> float | None:
    planned = predicted_stages.get((stage.plan_replica, stage.stage_index))
    return planned.step_ms if planned else None


_OVERLAY_STAGE_KEYS = ("stage_key", "device", "layers", "bits", "low_bits", "low_from", "state")


def deployment_overlay() -> list[dict[str, Any]]:
    """What the topology lays over the GPUs: each running deployment's pipelines, stages in pipeline
    order, and each pipeline's bottleneck device (its plan replica's, from the desired plan's prediction).

    Each pipeline is ``{"pipeline", "plan_replica", "bottleneck_device", "stages"}``. ``replicas`` (the
    same list) and a pipeline's ``index`` (= ``pipeline``) are deprecated names, kept until a later
    release (docs/api.md, "Deprecated fields")."""
    overlay = []
    for d in deployment_overview():
        if d["status"] == Deployment.Status.STOPPED:
            continue
        by_pipeline: dict[int, list[dict[str, Any]]] = {}
        for stage in d["stages"]:
            if stage["wanted"] and stage["device"]:
                by_pipeline.setdefault(stage["pipeline"], []).append(stage)
        bottlenecks = d["replica_bottlenecks"]
        pipelines = []
        for p, stages in sorted(by_pipeline.items()):
            r = stages[0]["plan_replica"]
            pipelines.append({"pipeline": p, "plan_replica": r, "index": p,
                              "bottleneck_device": bottlenecks[r] if r < len(bottlenecks) else None,
                              "stages": [{k: s[k] for k in _OVERLAY_STAGE_KEYS} for s in stages]})
        overlay.append({"id": d["id"], "name": d["name"], "status": d["status"], "pipelines": pipelines,
                        "replicas": pipelines})
    return overlay


def deployment_editor(*, deployment_id: int) -> dict[str, Any]:
    """What the plan editor starts from: the applied plan, the request it answered, the devices (with
    their node: a tensor-parallel group's ranks share one) and what a group's shares split (the model's
    ``layout``: key-value heads, MLP columns, the int4 group; None where its profile does not say), and
    the deployment's service-level targets (edited there through the deployments API, like the plan)."""
    deployment = Deployment.objects.select_related("model", "revision").get(pk=deployment_id)
    revision = deployment.revision
    devices = [{"name": d.name, "node": d.node.name, "model": d.model_name,
                "memory_gib": round(d.memory_bytes / GIB, 1), "emulated": d.emulated}
               for d in Device.objects.select_related("node").order_by("node__name", "index")]
    return {
        "deployment": {"id": deployment.pk, "name": deployment.name, "status": deployment.status},
        "model": {"id": deployment.model_id, "name": deployment.model.name,
                  "num_layers": deployment.model.num_layers, "layout": _layout(deployment.model)},
        "revision": {"id": revision.pk, "number": revision.number} if revision else None,
        "plan": revision.plan if revision else None,
        "request": revision.request if revision else {},
        "devices": devices,
        "targets": targets_of(deployment),
    }


def _layout(model: LlmModel) -> dict[str, int] | None:
    shares = layout(model_profile(model=model))
    return {"kv_heads": shares.kv_heads, "columns": shares.columns, "block": shares.block} if shares else None
