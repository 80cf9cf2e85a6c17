"""Operator actions on a node's intent: cordon, uncordon, drain, undrain.

What an operator wants of a node (``Node.intent``: schedulable, cordoned, draining) is written here
and nowhere else; what is seen of it (``Node.status``: ready, suspect, lost) is ``liveness.py``'s
alone. Neither writes the other's field, so a draining node that falls silent (LOST) and heartbeats
again is READY and still draining (ARCHITECTURE: "intent and observation are separate fields").

A node takes new stages only when it is schedulable and not LOST: a cordoned, draining or lost
node's devices are down for the planner (``inventory.selectors``) and refused by name in every
deployment check (``selectors.plan_devices``). What each action does, from each intent:

==========  ===================  =====================  ========================
action      from schedulable     from cordoned          from draining
==========  ===================  =====================  ========================
cordon      cordoned             nothing to do          refused: undrain first
uncordon    nothing to do        schedulable            refused: undrain it
drain       draining, stages     draining, stages       moves what is still there
            moved off            moved off
undrain     nothing to do        refused: uncordon it   schedulable
==========  ===================  =====================  ========================

Cordon leaves running stages where they are (reconcile does not look at intent); any new plan of
their deployment (an apply, an edit, a re-plan after a loss) is a new placement and goes around the
node. Drain re-plans every deployment with a stage there without it and refuses, naming the
deployment, when one does not fit; nothing is changed then. Undrain and uncordon make the node
schedulable again but move nothing back: a later plan (a rebalance, a new deployment) may use it.

Each action runs in one transaction with the node locked, validates first, and when it changes
something records one event (``events.event_record``) and one audit entry; repeating an action
changes and records nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from django.core.exceptions import ValidationError
from django.db import transaction

from controlplane.audit.services import SYSTEM, Actor, audit_record
from controlplane.deployments.desired_state import revision_apply
from controlplane.deployments.events import event_record
from controlplane.deployments.models import Deployment, DeploymentEvent, DeploymentStage, PlanRevision
from controlplane.deployments.revisions import plan_revision_check, replan_revision_create
from controlplane.deployments.selectors import desired_stages
from controlplane.inventory.models import Node
from controlplane.planning import PlanningError

Intent = Node.Intent
Kind = DeploymentEvent.Kind


@dataclass(frozen=True)
class NodeActionResult:
    """The node as the action left it, whether it changed anything, and the deployments it moved."""

    node: Node
    changed: bool
    deployments: list[Deployment] = field(default_factory=list)


@transaction.atomic
def node_cordon(*, node: Node, actor: Actor = SYSTEM) -> NodeActionResult:
    """No new stage on ``node``; the stages running there stay."""
    return _intent_change(
        node, Intent.CORDONED, actor=actor, action="node.cordoned", kind=Kind.NODE_CORDONED,
        refused_from=Intent.DRAINING,
        refusal="node {name} is draining, which already keeps new stages off it; undrain it first to leave "
                "it only cordoned",
        message="node {name} cordoned: no new stages; {stages} running stage(s) stay",
        detail=lambda locked: {"stages": DeploymentStage.objects.filter(node=locked, wanted=True).count()},
    )


@transaction.atomic
def node_uncordon(*, node: Node, actor: Actor = SYSTEM) -> NodeActionResult:
    """``node`` takes new stages again."""
    return _intent_change(
        node, Intent.SCHEDULABLE, actor=actor, action="node.uncordoned", kind=Kind.NODE_UNCORDONED,
        refused_from=Intent.DRAINING, refusal="node {name} is draining, not cordoned: undrain it",
        message="node {name} uncordoned: it takes new stages again",
    )


@transaction.atomic
def node_drain(*, node: Node, actor: Actor = SYSTEM) -> NodeActionResult:
    """Move every stage off ``node`` and keep new ones away; refused if a deployment cannot move.

    Each deployment with a stage on the node is re-planned without it first; only when every
    re-plan is deployable is anything changed. A node that is already draining has what is still
    on it moved (nothing, usually: nothing new was placed there).
    """
    node = _locked(node)
    on_node = DeploymentStage.objects.filter(node=node, wanted=True, deployment__stop_requested=False)
    # A pipeline being handed over off the node still runs there until its successor serves: only the
    # stages a deployment ends with count (a second drain while the first moves things moves nothing).
    candidates = Deployment.objects.select_for_update(no_key=True).filter(
        pk__in=on_node.values("deployment_id")).order_by("pk")
    affected = [d for d in candidates if any(s.node_id == node.pk for s in desired_stages(deployment=d))]
    checked = []
    for deployment in affected:
        try:
            revision = replan_revision_create(  # a degraded deployment stays degraded rather than refuse
                deployment=deployment, source=PlanRevision.Source.DRAIN, exclude_nodes=(node,),
                degrade=deployment.revision.degraded_from is not None,
            )
            plan_check = plan_revision_check(revision=revision, deployment=deployment, exclude_nodes=(node,))
            checked.append((deployment, plan_check))
        except (PlanningError, ValidationError) as exc:
            messages = exc.messages if isinstance(exc, ValidationError) else [str(exc)]
            raise ValidationError(
                {"node": f"cannot drain {node.name}: deployment {deployment.name} does not fit without it: "
                         + "; ".join(messages)}
            ) from None
    names = [d.name for d in affected]
    if node.intent != Intent.DRAINING:
        _intent_set(node, Intent.DRAINING, actor=actor, action="node.drained", kind=Kind.NODE_DRAINING,
                    message=f"node {node.name} draining: {len(affected)} deployment(s) moving off it",
                    detail={"deployments": names})
    elif affected:  # already draining: what was still there moves (the revisions' events say so)
        audit_record(actor=actor, action="node.drained", target=node,
                     detail={"was": node.intent, "intent": node.intent, "deployments": names})
    else:
        return NodeActionResult(node=node, changed=False)
    for deployment, plan_check in checked:
        revision_apply(deployment=deployment, checked=plan_check)
    return NodeActionResult(node=node, changed=True, deployments=affected)


@transaction.atomic
def node_undrain(*, node: Node, actor: Actor = SYSTEM) -> NodeActionResult:
    """``node`` takes new stages again; the stages drained off it are not moved back."""
    return _intent_change(
        node, Intent.SCHEDULABLE, actor=actor, action="node.undrained", kind=Kind.NODE_UNDRAINED,
        refused_from=Intent.CORDONED, refusal="node {name} is cordoned, not draining: uncordon it",
        message="node {name} undrained: it takes new stages again (nothing moves back by itself)",
    )


def _locked(node: Node) -> Node:
    return Node.objects.select_for_update(no_key=True).get(pk=node.pk)


def _intent_change(
    node: Node, intent: str, *, actor: Actor, action: str, kind: str, refused_from: str, refusal: str,
    message: str, detail: Callable[[Node], dict] | None = None,
) -> NodeActionResult:
    """Cordon, uncordon and undrain: with the node locked, refused (``refusal``) from ``refused_from``,
    nothing to do when it is ``intent`` already, else ``_intent_set``. ``refusal`` and ``message`` are
    formatted with the node's ``name`` and, for the message, ``detail(node)``'s entries (computed only
    when the intent changes)."""
    node = _locked(node)
    if node.intent == refused_from:
        raise ValidationError({"node": refusal.format(name=node.name)})
    if node.intent == intent:
        return NodeActionResult(node=node, changed=False)
    extra = detail(node) if detail is not None else {}
    _intent_set(node, intent, actor=actor, action=action, kind=kind,
                message=message.format(name=node.name, **extra), detail=extra)
    return NodeActionResult(node=node, changed=True)


def _intent_set(
    node: Node, intent: str, *, actor: Actor, action: str, kind: str, message: str, detail: dict | None = None
) -> None:
    """Write the intent alone (never ``status``, liveness's), record the event and the audit entry."""
    detail = {"was": node.intent, "intent": intent, **(detail or {})}
    node.intent = intent
    node.save(update_fields=["intent", "last_updated"])
    event_record(kind=kind, node=node, message=message, detail=detail)
    audit_record(actor=actor, action=action, target=node, detail=detail)
