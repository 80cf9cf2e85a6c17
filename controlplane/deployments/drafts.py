"""A deployment's draft model for speculative decoding, served as a deployment of its own
(docs/deployments.md, "Draft model").

The runtime serves a draft model as an ordinary one-stage pipeline that the target's head asks for
proposals (worker_runtime/draft_client.py), so the control plane deploys it as an ordinary deployment:
its plan is the planner's draft placement (controlplane/planning/draft.py: a card the target leaves
spare, close to the target's head, at the precision that proposes fastest within the quality
budget), and its agents, health, re-plans and handovers are every deployment's. The target's stage
specs carry the link to the draft's pipeline (``draft_link``), which the controller rewrites when that
pipeline changes.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from contracts.model_profile import ModelProfile
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.plan_request_form import WORKLOAD_KEYS, plan_request_from_dict
from controlplane.deployments.revisions import plan_revision_create, registered_fleet
from controlplane.deployments.selectors import deployment_endpoints, devices_in_use
from controlplane.models_catalog.models import LlmModel
from controlplane.planning import PlanningError
from controlplane.planning.draft import place_draft


def draft_link(*, deployment: Deployment) -> dict[str, Any] | None:
    """The ``draft`` of ``deployment``'s stage specs (contracts §1): the head of its draft deployment's
    serving pipeline, else of the newest one being deployed; None without a draft pipeline."""
    draft = deployment.draft_deployment
    if draft is None or draft.stop_requested:
        return None
    heads = sorted(deployment_endpoints(deployment=draft), key=lambda h: (h.serving, h.ready, h.pipeline))
    if not heads:
        return None
    head = heads[-1]
    return {"address": head.head_address, "pipeline_id": head.pipeline_id, "auth_token": head.auth_token}


def draft_model_check(*, target: LlmModel, draft: LlmModel) -> None:
    """ValidationError naming ``draft_model`` unless ``draft`` can propose tokens for ``target``: weights
    to serve, and the same vocabulary (a proposal is a token id of the target's tokenizer)."""
    if draft.pk == target.pk:
        raise ValidationError({"draft_model": "the draft model must be another, smaller model than the "
                                              f"one it drafts for ({target})"})
    if not draft.has_weights:
        raise ValidationError({"draft_model": f"{draft} has no weights to serve"})
    vocab, draft_vocab = target.config.get("vocab_size"), draft.config.get("vocab_size")
    if vocab != draft_vocab:
        raise ValidationError({"draft_model": f"{draft} has a vocabulary of {draft_vocab} tokens, {target} "
                                              f"of {vocab}: a draft model shares its target's tokenizer"})


def draft_revision(*, target_revision: PlanRevision, draft: LlmModel, proposals: int) -> PlanRevision:
    """A revision of ``draft`` placing it where the planner's draft placement says, beside the target's
    plan ``target_revision``: on a card neither it nor another deployment uses. ValidationError naming
    ``draft_model`` when no card can take it."""
    # A draft's precision lowers its acceptance, never the output: every layer may be quantized, within
    # the measured quality budget where the target's request sets one.
    request = {**{key: value for key, value in target_revision.request.items()
                  if key in (*WORKLOAD_KEYS, "bits", "quality")}, "max_quantized": 1.0}
    profile = ModelProfile.from_dict(draft.profile)
    try:
        plan_request = plan_request_from_dict(request, fleet=registered_fleet(), profile=profile,
                                              exclude_devices=tuple(devices_in_use(deployment=None)))
        placed = place_draft(plan_request, target_revision.placements, profile, proposals)
    except PlanningError as exc:
        raise ValidationError({"draft_model": f"no card for the draft model {draft}: {exc}"}) from None
    stage = {"device": placed.placement.device, "layers": [0, profile.num_layers],
             "bits": placed.placement.bits, **placed.placement.precision.split_fields()}
    return plan_revision_create(model=draft, plan={"replicas": [{"stages": [stage]}]},
                                request={**request, "replicas": 1}, source=PlanRevision.Source.PLANNER)


def draft_name(target: str) -> str:
    """The draft deployment's name: the target's with ``-draft``, numbered past those taken."""
    name, number = f"{target}-draft", 1
    while Deployment.objects.filter(name=name).exists():
        number += 1
        name = f"{target}-draft-{number}"
    return name
