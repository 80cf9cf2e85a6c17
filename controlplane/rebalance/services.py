"""The rebalance policy's decisions (``rebalance_evaluate``) and an operator's answer to a proposal
(``proposal_accept``, ``proposal_dismiss``).

Whatever the trigger, the decision is the same (docs/deployments.md, "Rebalance policy"): re-plan on
the fleet as it is now with the revision's own request, and act only when the gain is worth a change
and nothing else is changing. The damping, in the order it is checked:

- a deployment that is not READY, or has a pipeline the controller is handing over or a stage still
  being stopped, is not evaluated at all (one change in flight at most);
- within ``MOTLEY_REBALANCE_COOLDOWN_S`` of the last applied change the decision waits (``held``);
- the planner's plan must pass its own ``validate`` and beat the applied one, priced on the same
  fleet, by ``MOTLEY_REBALANCE_MIN_GAIN``; a demand change (one replica more or fewer, else twice
  the batch: demand.py) is judged instead by its prediction at the forecast load: a scale-in that
  would miss a target is not made.

Each trigger occurrence is decided once (its key is remembered in ``RebalanceState.handled``), and a
decision that waits is recorded once however many passes it waits: every decision, taken or not, is
a ``policy`` event when it differs from the last one recorded.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.audit.services import Actor, audit_record
from controlplane.deployments.events import event_record
from controlplane.deployments.models import Deployment, DeploymentEvent, PlanRevision
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_apply
from controlplane.planning import replica_placements
from controlplane.rebalance import demand, triggers
from controlplane.rebalance.diff import plan_diff
from controlplane.rebalance.models import RebalanceProposal, RebalanceState
from controlplane.rebalance.pricing import Pricing, fleet_now, free_devices, price, throttled_devices
from controlplane.rebalance.selectors import change_in_flight

if TYPE_CHECKING:
    from contracts.hardware import FleetSpec
    from controlplane.rebalance.triggers import Occurrence

POLICY_ACTOR = Actor(user=None, label="rebalance policy", via="system")
HANDLED_KEEP = 50  # occurrence keys remembered per deployment (a revision applied forgets them all)


@dataclass(frozen=True)
class Observed:
    """What a pass saw of one deployment before pricing anything: the occurrence to decide (None: only
    the periodic better-plan check is due) and the fleet it was seen on."""

    deployment: Deployment
    occurrence: Occurrence | None
    fleet: FleetSpec


def rebalance_evaluate(*, deployment_id: int, now: float | None = None) -> str | None:
    """One pass of the policy over one deployment; returns what it decided (``proposed``,
    ``applied``, ``kept``, ``held``, ``refused``) or None when nothing triggered. The beat's pass
    over every deployment (``card_claims.rebalance_pass``) runs the same two steps, observing every
    deployment before it settles any, so that scale-outs competing for free cards share them."""
    now = time.time() if now is None else now
    observed = rebalance_observe(deployment_id=deployment_id, now=now)
    return None if observed is None else rebalance_settle(observed=observed, now=now)


def rebalance_observe(*, deployment_id: int, now: float) -> Observed | None:
    """Record this pass's readings of the deployment (triggers, load series) and say what is to be
    decided; None when nothing is."""
    with transaction.atomic():
        found = _watched(deployment_id=deployment_id)
        if found is None:
            return None
        deployment, state = found
        throttle = throttled_devices()
        fleet = fleet_now(throttle=throttle)
        if state.revision_id != deployment.revision_id:
            triggers.baseline_take(state=state, deployment=deployment, fleet=fleet, now=now)
            _expire_open(deployment=deployment)
        occurring = [triggers.fleet_changed(state=state, deployment=deployment, fleet=fleet),
                     triggers.throttled(state=state, deployment=deployment, throttle=throttle, now=now),
                     triggers.drift(state=state, deployment=deployment, now=now),
                     demand.demand(state=state, deployment=deployment, now=now)]
        occurrence = next((o for o in occurring if o is not None and o.key not in state.handled), None)
        since_checked = now - (state.better_checked_at or 0)
        better_due = occurrence is None and since_checked >= settings.MOTLEY_REBALANCE_CHECK_S
        if better_due:
            state.better_checked_at = now
        state.save()
    if occurrence is None and not better_due:
        return None
    return Observed(deployment, occurrence, fleet)


def rebalance_settle(*, observed: Observed, now: float, withheld: Iterable[str] = ()) -> str | None:
    """Price and decide what ``rebalance_observe`` saw. ``withheld``: free cards this deployment's
    re-plan may not use (the joint pass gave them to other deployments).

    The plans are priced between two short transactions, not under the deployment's row lock: a
    re-plan is a planner run, and operators' applies and the controller's reconciles wait on that
    row. The decision is taken only if the revision the triggers saw is still the applied one."""
    deployment, occurrence, fleet = observed.deployment, observed.occurrence, observed.fleet
    asks = (demand.asks(deployment=deployment, occurrence=occurrence,
                        free_cards=len(set(free_devices(fleet=fleet)) - set(withheld)))
            if occurrence is not None and occurrence.trigger == RebalanceProposal.Trigger.DEMAND else [None])
    for changes in asks:  # a demand change's alternatives, the first the planner fits
        pricing = price(deployment=deployment, fleet=fleet, changes=changes, withheld=withheld)
        if pricing.proposed is not None and (changes is None or demand.delivers(pricing.proposed, changes)):
            break
    else:
        pricing = dataclasses.replace(pricing, proposed=None, proposed_tokens_per_s=0.0,
                                      problem=f"the planner fits none of {demand.asks_text(asks)} now")
    if occurrence is None:
        if pricing.proposed is None or pricing.gain < settings.MOTLEY_REBALANCE_MIN_GAIN:
            return None
        occurrence = triggers.Occurrence(
            RebalanceProposal.Trigger.BETTER_PLAN, f"better_plan@{now:.0f}",
            f"the planner finds a plan {pricing.gain:+.0%} faster on the fleet as it is now")
    priced_revision = deployment.revision_id
    with transaction.atomic():
        found = _watched(deployment_id=deployment.pk)
        if found is None:
            return None
        deployment, state = found
        if deployment.revision_id != priced_revision or occurrence.key in state.handled:
            return None  # changed while it was priced: the next pass decides on what is applied then
        outcome = _decide(deployment=deployment, state=state, occurrence=occurrence, pricing=pricing, now=now)
        state.save()
        return outcome


def _watched(*, deployment_id: int) -> tuple[Deployment, RebalanceState] | None:
    """The deployment and its policy state, both locked, when the policy watches it now: policy not
    off, a revision applied, no change in flight."""
    # of=("self",): PostgreSQL cannot lock the nullable side (revision) of the outer join.
    locked = Deployment.objects.select_for_update(of=("self",), no_key=True)
    deployment = locked.select_related("revision", "model").get(pk=deployment_id)
    if (deployment.rebalance_policy == Deployment.RebalancePolicy.OFF or deployment.revision is None
            or change_in_flight(deployment=deployment)):
        return None
    state, _ = RebalanceState.objects.select_for_update(no_key=True).get_or_create(deployment=deployment)
    return deployment, state


def _decide(*, deployment: Deployment, state: RebalanceState, occurrence: Occurrence, pricing: Pricing,
            now: float) -> str:
    applied_at = deployment.revision.applied_at
    since = now - applied_at.timestamp() if applied_at else None
    figures = {"current_tokens_per_s": round(pricing.current_tokens_per_s, 2),
               "proposed_tokens_per_s": round(pricing.proposed_tokens_per_s, 2),
               "gain": round(pricing.gain, 4) if pricing.proposed else None, "repriced": pricing.repriced}
    cooldown = settings.MOTLEY_REBALANCE_COOLDOWN_S
    if since is not None and since < cooldown:
        return _record(deployment, state, occurrence, "held", figures, final=False,
                       why=f"waits: the last change was applied {since:.0f} s ago (cooldown {cooldown:g} s)")
    if pricing.proposed is None:
        return _record(deployment, state, occurrence, "held", figures, why=f"no change: {pricing.problem}")
    proposed = replica_placements(pricing.proposed)
    diff = plan_diff(deployment.revision.placements, proposed)
    if (batches := [deployment.revision.plan.get("batch"), pricing.proposed.get("batch")])[0] != batches[1]:
        diff["batch"] = batches  # a demand change's larger batch: the same stages, more sequences and KV
    if not diff["stages"] and "batch" not in diff:
        return _record(deployment, state, occurrence, "held", figures,
                       why="no change: the planner's plan is the applied one")
    gains = (f"{pricing.proposed_tokens_per_s:.1f} tokens/s predicted against "
             f"{pricing.current_tokens_per_s:.1f} now ({pricing.gain:+.0%})")
    forecast = {}
    if occurrence.trigger == RebalanceProposal.Trigger.DEMAND:
        forecast = demand.prediction(deployment=deployment, occurrence=occurrence, plan=pricing.proposed)
        figures["forecast"], gains = forecast, demand.prediction_text(forecast)
        if occurrence.detail["action"] == "in" and not forecast["meets"]:
            return _record(deployment, state, occurrence, "held", figures, why=f"no change: {gains}")
    elif pricing.gain < (threshold := settings.MOTLEY_REBALANCE_MIN_GAIN):
        return _record(deployment, state, occurrence, "held", figures,
                       why=f"no change: {gains}, under the {threshold:.0%} threshold")
    proposals = RebalanceProposal.objects.filter(deployment=deployment)
    open_ = proposals.filter(status=RebalanceProposal.Status.OPEN).first()
    if open_ is not None and _same(open_.revision, pricing.proposed):
        return _record(deployment, state, occurrence, "kept", figures,
                       why=f"proposal {open_.pk} already proposes this plan: {gains}")
    dismissed = proposals.filter(base_revision=deployment.revision,
                                 status=RebalanceProposal.Status.DISMISSED).first()
    if dismissed is not None and _same(dismissed.revision, pricing.proposed):
        return _record(deployment, state, occurrence, "held", figures,
                       why=f"no change: proposal {dismissed.pk} of this plan was dismissed ({gains})")
    proposal = _propose(deployment=deployment, occurrence=occurrence, pricing=pricing, diff=diff,
                        superseding=open_, forecast=forecast)
    figures["proposal"] = proposal.pk
    if deployment.rebalance_policy == Deployment.RebalancePolicy.PROPOSE:
        return _record(deployment, state, occurrence, "proposed", figures,
                       why=f"proposal {proposal.pk}: {gains}")
    try:
        with transaction.atomic():
            deployment_apply(deployment=deployment, revision=proposal.revision, actor=POLICY_ACTOR)
            proposal.status, proposal.decided_at = RebalanceProposal.Status.ACCEPTED, timezone.now()
            proposal.save(update_fields=["status", "decided_at"])
    except ValidationError as exc:
        proposal.status, proposal.decided_at = RebalanceProposal.Status.DISMISSED, timezone.now()
        proposal.save(update_fields=["status", "decided_at"])
        return _record(deployment, state, occurrence, "refused", figures,
                       why=f"not applied, the controller refused it: {'; '.join(exc.messages)}")
    return _record(deployment, state, occurrence, "applied", figures,
                   why=f"applied as revision {proposal.revision.number}: {gains}")


def _same(revision: PlanRevision, plan: dict) -> bool:
    """The revision's plan places the same stages as ``plan`` at the same batch."""
    return (not plan_diff(revision.placements, replica_placements(plan))["stages"]
            and revision.plan.get("batch") == plan.get("batch"))


def _propose(*, deployment: Deployment, occurrence: Occurrence, pricing: Pricing, diff: dict,
             superseding: RebalanceProposal | None, forecast: dict) -> RebalanceProposal:
    if superseding is not None:
        superseding.status, superseding.decided_at = RebalanceProposal.Status.SUPERSEDED, timezone.now()
        superseding.save(update_fields=["status", "decided_at"])
    revision = plan_revision_create(model=deployment.model, plan=pricing.proposed, request=pricing.request,
                                    source=PlanRevision.Source.REBALANCE, deployment=deployment,
                                    degraded_from=deployment.revision.degraded_from)  # still restored
    return RebalanceProposal.objects.create(
        deployment=deployment, base_revision=deployment.revision, revision=revision,
        trigger=occurrence.trigger, gain=pricing.gain, forecast=forecast,
        reason=f"{occurrence.reason}; {demand.prediction_text(forecast)}" if forecast else occurrence.reason,
        current_tokens_per_s=pricing.current_tokens_per_s,
        proposed_tokens_per_s=pricing.proposed_tokens_per_s,
        diff=diff,
    )


def _record(deployment: Deployment, state: RebalanceState, occurrence: Occurrence, outcome: str,
            figures: dict, *, why: str, final: bool = True) -> str:
    """A decision: remembered as decided when ``final``, and an event unless it repeats the last one
    recorded (a decision that waits, pass after pass)."""
    if final:
        state.handled = [*state.handled, occurrence.key][-HANDLED_KEEP:]
    key = f"{outcome}:{occurrence.key}"[:200]
    if key != state.last_decision:
        state.last_decision = key
        event_record(
            kind=DeploymentEvent.Kind.POLICY, deployment=deployment,
            message=f"rebalance ({deployment.rebalance_policy}, {occurrence.trigger}): "
                    f"{occurrence.reason}; {why}",
            detail={"outcome": outcome, "trigger": occurrence.trigger, "reason": occurrence.reason,
                    "policy": deployment.rebalance_policy, **occurrence.detail, **figures},
        )
    return outcome


def _expire_open(*, deployment: Deployment) -> None:
    """Another revision was applied: open proposals made against the previous one no longer apply."""
    RebalanceProposal.objects.filter(deployment=deployment, status=RebalanceProposal.Status.OPEN).exclude(
        base_revision=deployment.revision).update(status=RebalanceProposal.Status.EXPIRED,
                                                  decided_at=timezone.now())


@transaction.atomic
def proposal_accept(*, proposal: RebalanceProposal, actor: Actor) -> RebalanceProposal:
    """Apply an open proposal's plan through the operator path (``deployment_apply``: checked on the
    fleet as it is now, audited ``plan.rebalanced`` by ``actor``); a refusal changes nothing."""
    proposal = _open(proposal)
    deployment_apply(deployment=proposal.deployment, revision=proposal.revision, actor=actor)
    proposal.status, proposal.decided_at, proposal.decided_by = (
        RebalanceProposal.Status.ACCEPTED, timezone.now(), actor.user)
    proposal.save(update_fields=["status", "decided_at", "decided_by"])
    return proposal


@transaction.atomic
def proposal_dismiss(*, proposal: RebalanceProposal, actor: Actor) -> RebalanceProposal:
    """Close an open proposal unapplied (audited ``rebalance_proposal.dismissed``). Its trigger stays
    decided: the same occurrence does not propose again, a new one may."""
    proposal = _open(proposal)
    proposal.status, proposal.decided_at, proposal.decided_by = (
        RebalanceProposal.Status.DISMISSED, timezone.now(), actor.user)
    proposal.save(update_fields=["status", "decided_at", "decided_by"])
    audit_record(actor=actor, action="rebalance_proposal.dismissed", target=proposal.deployment, detail={
        "proposal": proposal.pk, "revision": proposal.revision_id, "trigger": proposal.trigger,
        "gain": proposal.gain})
    return proposal


def _open(proposal: RebalanceProposal) -> RebalanceProposal:
    locked = RebalanceProposal.objects.select_for_update(of=("self",), no_key=True).select_related(
        "deployment", "revision").get(pk=proposal.pk)
    if locked.status != RebalanceProposal.Status.OPEN:
        raise ValidationError({"proposal": f"rebalance proposal {locked.pk} is {locked.status}, not open"})
    if locked.deployment.revision_id != locked.base_revision_id:
        raise ValidationError({"proposal": f"rebalance proposal {locked.pk} was made for revision "
                                           f"{locked.base_revision_id}, the deployment has applied another"})
    return locked
