"""The settings a deployment's running stages take in place: its serving switches (prefix caching,
speculation and the link to its draft model's pipeline), as every stage spec carries them, and the
writer that sends a change to the stages (contracts §1, "respec")."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.utils import timezone

from controlplane.deployments import dispatch, handover
from controlplane.deployments.drafts import draft_link
from controlplane.deployments.models import Deployment, DeploymentPipeline, DeploymentStage

# The deployment's settings that every stage spec carries and a running stage takes in place: the
# serving switches an operator changes without a new plan (contracts §1, "respec").
SERVING_SWITCHES = ("prefix_caching", "speculation", "speculative_tokens")


def serving_switches(deployment: Deployment) -> dict[str, Any]:
    """The deployment's serving switches, as its stage specs carry them, with speculation ``"draft"``'s
    link to the draft pipeline (``drafts.draft_link``); while its draft deployment has no pipeline,
    the head proposes by prompt lookup instead."""
    switches = {name: getattr(deployment, name) for name in SERVING_SWITCHES}
    switches["draft"] = draft_link(deployment=deployment) if deployment.speculation == "draft" else None
    if deployment.speculation == "draft" and switches["draft"] is None:
        switches["speculation"] = "lookup"
    return switches


def _switches_reason(deployment: Deployment, names: set[str]) -> str:
    """What changed, in words: the reason of the reload it starts."""
    reasons = []
    if "prefix_caching" in names:
        reasons.append(f"prefix caching turned {'on' if deployment.prefix_caching else 'off'}")
    if "draft" in names and deployment.speculation == "draft":
        reasons.append("the draft model's pipeline changed")
    if names & {"speculation", "speculative_tokens"}:
        reasons.append("speculation off" if deployment.speculation == "off" else
                       f"speculation {deployment.speculation}, at most {deployment.speculative_tokens} "
                       f"proposed tokens per step")
    return "; ".join(reasons)


def serving_switches_stale(*, deployment: Deployment) -> bool:
    """Whether the deployment's head stage runs other serving switches than ``serving_switches`` gives
    now: only a draft pipeline that changed makes them so without ``serving_switches_write``."""
    if deployment.speculation != "draft" or deployment.stop_requested:
        return False
    head = deployment.stages.filter(wanted=True, stage_index=0).exclude(spec={}).order_by("-pipeline").first()
    return head is not None and any(head.spec.get(key) != value
                                    for key, value in serving_switches(deployment).items())


def serving_switches_write(*, deployment: Deployment) -> list[DeploymentStage]:
    """Write the deployment's serving switches (``SERVING_SWITCHES``) into the spec of every stage that
    serves it or will (a held one, and the spec a prepared handover gives at its release), and ask for
    a reconcile, which sends each changed spec. A stage takes them in place (contracts §1, "respec":
    same layers, precision and KV pool, nothing reloaded), leaving its pipeline meanwhile: a serving
    pipeline is reloading (not routed to, ``handover.reload_started``) until its stages are ready
    again, so no request is sent into that pause. An outgoing pipeline finishes with the spec it runs.
    The changed rows are returned."""
    pipelines = {p.index: p for p in deployment.pipelines.all()}
    rows = deployment.stages.filter(Q(wanted=True) | Q(held=True)).exclude(pipeline__in=[
        index for index, p in pipelines.items() if p.phase == DeploymentPipeline.Phase.OUTGOING])
    switches = serving_switches(deployment)
    changed, names = [], set()
    for row in rows.order_by("pipeline", "stage_index"):
        fields = []
        for name in ("spec", "next_spec"):
            spec = getattr(row, name)
            differ = {key for key, value in switches.items() if spec and spec.get(key) != value}
            if differ:  # {}: not written yet
                setattr(row, name, {**spec, **switches})
                fields.append(name)
                names |= differ
        if fields:
            row.save(update_fields=fields)
            changed.append(row)
    now, reason = timezone.now(), _switches_reason(deployment, names)
    for index, pipeline in pipelines.items():
        starting = [row.stage_key for row in changed if row.pipeline == index and row.wanted]
        if starting and pipeline.phase == DeploymentPipeline.Phase.SERVING:
            handover.reload_started(pipeline=pipeline, starting=starting, reason=reason, now=now)
    dispatch.reconcile_on_commit(deployment_id=deployment.pk)
    return changed
