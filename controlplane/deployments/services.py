"""Operator actions on deployments: create, change settings, apply a plan, stop.

What the API (and the demo) calls; each runs in one transaction, validates first and changes
nothing when refused. They decide *what* is wanted and hand the writing to the modules that own it:
``revisions.py`` checks a plan, ``desired_state.py`` writes its stages, and the controller
(``reconcile.py``) acts on the result once the transaction commits. The actions on a node's intent
(cordon, uncordon, drain, undrain) are in ``node_actions.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction

from contracts.routing import DEFAULT_ROUTING_STRATEGY, ROUTING_STRATEGIES
from contracts.stage_spec import MAX_SPECULATIVE_TOKENS, SPECULATION_MODES
from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.deployments import dispatch, drafts
from controlplane.deployments.desired_state import revision_apply
from controlplane.deployments.events import event_record
from controlplane.deployments.models import Deployment, DeploymentEvent, PlanRevision
from controlplane.deployments.revisions import plan_revision_check
from controlplane.deployments.serving_switches import SERVING_SWITCHES, serving_switches_write
from controlplane.deployments.targets import targets_check, targets_of
from controlplane.models_catalog.models import LlmModel

if TYPE_CHECKING:
    from django.contrib.auth.models import AbstractBaseUser


@transaction.atomic
def deployment_create(
    *, name: str, revision: PlanRevision, replan_on_failure: bool = True,
    routing_strategy: str = DEFAULT_ROUTING_STRATEGY, prefix_caching: bool = True,
    speculation: str = "off", speculative_tokens: int = 4, draft_model: LlmModel | None = None,
    targets: Mapping[str, Any] | None = None, created_by: AbstractBaseUser | None = None,
    actor: Actor = SYSTEM,
) -> Deployment:
    """Create a deployment whose desired state is ``revision`` and start deploying it (audited:
    ``deployment.created``, by ``actor``); with speculation ``"draft"``, ``draft_model`` is deployed
    first as a deployment of its own where the planner places it (``drafts.py``). ``targets``: any of
    its service-level targets (targets.py; the others keep their defaults)."""
    targets = {**targets_of(Deployment()), **(targets or {})}
    targets_check(targets, model=revision.model)
    _require_draft_revision(revision)
    _require_strategy(routing_strategy)
    _require_speculation(speculation, speculative_tokens)
    if Deployment.objects.filter(name=name).exists():
        raise ValidationError({"name": f"a deployment named {name!r} exists"})
    if draft_model is not None and speculation != "draft":
        raise ValidationError({"draft_model": 'a draft model serves only speculation "draft"'})
    checked = plan_revision_check(revision=revision)
    draft = (_draft_create(target=name, target_revision=revision, draft_model=draft_model,
                           proposals=speculative_tokens, actor=actor)
             if speculation == "draft" else None)
    deployment = Deployment.objects.create(
        name=name, model=revision.model, replan_on_failure=replan_on_failure,
        routing_strategy=routing_strategy, prefix_caching=prefix_caching, speculation=speculation,
        speculative_tokens=speculative_tokens, draft_deployment=draft, created_by=created_by, **targets,
    )
    revision_apply(deployment=deployment, checked=checked)
    audit_record(actor=actor, action="deployment.created", target=deployment, detail={
        "model": revision.model.name, "revision": revision.pk, "source": revision.source,
        "routing_strategy": routing_strategy, "replan_on_failure": replan_on_failure,
        "prefix_caching": prefix_caching, "speculation": speculation,
        "speculative_tokens": speculative_tokens, "draft_deployment": draft.name if draft else None,
        "targets": targets,
    })
    return deployment


@transaction.atomic
def deployment_update(
    *, deployment: Deployment, routing_strategy: str | None = None, replan_on_failure: bool | None = None,
    rebalance_policy: str | None = None, prefix_caching: bool | None = None, speculation: str | None = None,
    speculative_tokens: int | None = None, draft_model: LlmModel | None = None,
    targets: Mapping[str, Any] | None = None, actor: Actor = SYSTEM,
) -> Deployment:
    """Change the settings that need no new plan; the gateway picks a new strategy up at its next
    refresh (in-flight requests finish where they are), the rebalance policy its next pass, and the
    stages a changed serving switch (``prefix_caching``, ``speculation``, ``speculative_tokens``) with
    their spec, in place (``serving_switches_write``). Speculation turned to ``"draft"`` (or a new
    ``draft_model``) deploys the draft model first (``drafts.py``); turned away from it, the draft
    deployment is stopped. A change is audited (``deployment.updated``, each field's before and
    after); a request that changes nothing records nothing. ``targets``: the service-level targets to
    change (targets.py), checked together with those kept; null clears a target that may be null."""
    deployment = Deployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
    changes = {}
    if routing_strategy is not None:
        _require_strategy(routing_strategy)
        changes["routing_strategy"] = [deployment.routing_strategy, routing_strategy]
        deployment.routing_strategy = routing_strategy
    if replan_on_failure is not None:
        changes["replan_on_failure"] = [deployment.replan_on_failure, replan_on_failure]
        deployment.replan_on_failure = replan_on_failure
    if rebalance_policy is not None:
        policies = Deployment.RebalancePolicy.values
        if rebalance_policy not in policies:
            raise ValidationError({"rebalance_policy": f"unknown rebalance policy {rebalance_policy!r}; "
                                                       f"choose one of {', '.join(policies)}"})
        changes["rebalance_policy"] = [deployment.rebalance_policy, rebalance_policy]
        deployment.rebalance_policy = rebalance_policy
    if targets:
        wanted = {**targets_of(deployment), **targets}
        targets_check(wanted, model=deployment.model)
        for name, value in targets.items():
            changes[name] = [getattr(deployment, name), value]
            setattr(deployment, name, value)
    _require_speculation(deployment.speculation if speculation is None else speculation,
                         deployment.speculative_tokens if speculative_tokens is None else speculative_tokens)
    for name, value in (("prefix_caching", prefix_caching), ("speculation", speculation),
                        ("speculative_tokens", speculative_tokens)):
        if value is not None:
            changes[name] = [getattr(deployment, name), value]
            setattr(deployment, name, value)
    changes = {field: values for field, values in changes.items() if values[0] != values[1]}
    _draft_follow(deployment=deployment, draft_model=draft_model, changes=changes, actor=actor)
    if changes:
        deployment.save(update_fields=[*changes, "last_updated"])
        audit_record(actor=actor, action="deployment.updated", target=deployment, detail=changes)
    if set(changes) & {*SERVING_SWITCHES, "draft_deployment"}:
        serving_switches_write(deployment=deployment)
    return deployment


@transaction.atomic
def deployment_apply(*, deployment: Deployment, revision: PlanRevision, actor: Actor = SYSTEM) -> Deployment:
    """Make ``revision`` the desired state; only the stages whose spec changes are restarted.

    Audited by where the plan came from (``APPLY_ACTIONS``): an operator's edit (``plan.edited``),
    the planner's proposal, e.g. the plan editor's Rebalance (``plan.proposal_accepted``), else
    ``plan.applied``.
    """
    deployment = Deployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
    if deployment.stop_requested:
        raise ValidationError({"deployment": f"deployment {deployment.name} is stopped"})
    _require_draft_revision(revision)
    if revision.model_id != deployment.model_id:
        raise ValidationError(
            {"revision": f"the plan is for {revision.model}, the deployment serves {deployment.model}"}
        )
    if revision.deployment_id not in (None, deployment.pk):
        raise ValidationError({"revision": "the plan revision belongs to another deployment"})
    checked = plan_revision_check(revision=revision, deployment=deployment)
    previous = deployment.revision
    revision_apply(deployment=deployment, checked=checked)
    audit_record(actor=actor, action=APPLY_ACTIONS.get(revision.source, "plan.applied"), target=deployment,
                 detail={"revision": revision.pk, "number": revision.number, "source": revision.source,
                         "previous_revision": previous.pk if previous else None})
    return deployment


# What applying a revision is audited as, by the revision's source (any other: "plan.applied").
APPLY_ACTIONS = {
    PlanRevision.Source.EDITED: "plan.edited", PlanRevision.Source.PLANNER: "plan.proposal_accepted",
    PlanRevision.Source.REBALANCE: "plan.rebalanced",
}


@transaction.atomic
def deployment_stop(*, deployment: Deployment, actor: Actor = SYSTEM) -> Deployment:
    """Stop every stage; the deployment is STOPPED once each one's agent confirmed (or is lost).
    The first request is audited (``deployment.stopped``); a repeated one changes nothing."""
    deployment = Deployment.objects.select_for_update(no_key=True).get(pk=deployment.pk)
    if not deployment.stop_requested:
        event_record(kind=DeploymentEvent.Kind.STOPPING, message="stop requested", deployment=deployment)
        audit_record(actor=actor, action="deployment.stopped", target=deployment)
    deployment.stop_requested = True
    deployment.status_message = "stopping"
    deployment.save(update_fields=["stop_requested", "status_message", "last_updated"])
    deployment.stages.filter(wanted=True).update(wanted=False)
    dispatch.reconcile_on_commit(deployment_id=deployment.pk)
    if deployment.draft_deployment is not None:  # its draft serves nothing else
        deployment_stop(deployment=deployment.draft_deployment, actor=actor)
    return deployment


def _draft_create(*, target: str, target_revision: PlanRevision, draft_model: LlmModel | None,
                  proposals: int, actor: Actor) -> Deployment:
    """Deploy ``draft_model`` for the deployment ``target`` serving ``target_revision``'s plan."""
    if draft_model is None:
        raise ValidationError({"draft_model": 'speculation "draft" needs a draft_model: a smaller model '
                                              "sharing the deployment's tokenizer"})
    drafts.draft_model_check(target=target_revision.model, draft=draft_model)
    revision = drafts.draft_revision(target_revision=target_revision, draft=draft_model, proposals=proposals)
    return deployment_create(name=drafts.draft_name(target), revision=revision, actor=actor)


def _draft_follow(*, deployment: Deployment, draft_model: LlmModel | None, changes: dict,
                  actor: Actor) -> None:
    """Deploy, replace or stop the deployment's draft deployment as its speculation now asks, recording
    the change in ``changes`` (``draft_deployment``: the names before and after)."""
    old = deployment.draft_deployment
    wanted = deployment.speculation == "draft"
    if draft_model is not None and not wanted:
        raise ValidationError({"draft_model": 'a draft model serves only speculation "draft"'})
    if wanted and old is not None and not old.stop_requested and draft_model in (None, old.model):
        return
    new = None
    if wanted:
        new = _draft_create(target=deployment.name, target_revision=deployment.revision,
                            draft_model=draft_model or (old.model if old is not None else None),
                            proposals=deployment.speculative_tokens, actor=actor)
    if old is not None:
        deployment_stop(deployment=old, actor=actor)
    if new is not old:
        deployment.draft_deployment = new
        changes["draft_deployment"] = [old.name if old else None, new.name if new else None]

def _require_strategy(strategy: str) -> None:
    if strategy not in ROUTING_STRATEGIES:
        raise ValidationError({"routing_strategy": f"unknown routing strategy {strategy!r}; "
                                                   f"choose one of {', '.join(ROUTING_STRATEGIES)}"})


def _require_speculation(mode: str, tokens: int) -> None:
    if mode not in SPECULATION_MODES:
        raise ValidationError({"speculation": f"unknown speculation mode {mode!r}; "
                                              f"choose one of {', '.join(SPECULATION_MODES)}"})
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_SPECULATIVE_TOKENS:
        raise ValidationError({"speculative_tokens": f"must be an integer in [1, {MAX_SPECULATIVE_TOKENS}]; "
                                                     f"got {tokens!r}"})


def _require_draft_revision(revision: PlanRevision) -> None:
    if revision.status != PlanRevision.Status.DRAFT:
        raise ValidationError({"revision": f"plan revision {revision.pk} is {revision.status}, not a draft"})
