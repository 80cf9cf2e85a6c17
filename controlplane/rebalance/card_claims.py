"""The beat's policy pass over every deployment (``rebalance_pass``), with the free cards shared out
jointly among the deployments that want to scale out at once.

A pass observes every watched deployment first (``services.rebalance_observe``: triggers and load
recorded, nothing priced), then settles each, the highest priority first. Where two or more demand
occurrences are scale-outs (one replica more) and the free cards each could use overlap, they
compete: each is a claimant (``planning.card_shares.Claimant``) with

- its priority (``Deployment.priority``);
- its need: the tokens/s its applied plan lacks to bring the forecast load under the scale-out mark
  (``capacity * (utilisation / MOTLEY_REBALANCE_DEMAND_HIGH - 1)``, the utilisation the policy
  decided on: the larger of the tokens and the sequence slots' shares, planning/demand.py); where the
  load is under the mark (a measured percentile over its target set the scale-out off), one replica
  like its own (``capacity / replicas``);
- each free card's worth to it (``planning.card_worth``: tokens/s at the best precision its quality
  budget allows, 0 where its layers cannot use the card or its request excludes it).

``card_shares.assign`` gives the cards out (the need met at the highest priority first, then by
worth, then the fewest cards; in steps of a twentieth of each need, and with no card left that
completes no replica: ``card_worth.assign_whole``), and
every deployment's re-plan in this pass is made without the cards given to the others
(``rebalance_settle(withheld=...)``); a card given to nobody stays open to all, first come, first
served, as without competition. A claimant's occurrence carries what it was given and why: its
reason says so in words with the numbers, and its ``detail`` (so the policy event's) holds them
under ``cards`` (each free card's worth to it too). Free cards are the registered fleet's devices
that are up and carry no deployment's stage. One cost model per claimant and one price per free
card: no planner search before the re-plans themselves.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterable

from django.conf import settings

from contracts.hardware import FleetSpec
from controlplane.deployments.revisions import request_on_fleet
from controlplane.deployments.selectors import devices_in_use
from controlplane.planning import PlanningError
from controlplane.planning.card_shares import Claimant
from controlplane.planning.card_worth import CardWorth, assign_whole, card_worth
from controlplane.planning.cost_model import CostModel
from controlplane.rebalance.demand import capacity_of
from controlplane.rebalance.models import RebalanceProposal
from controlplane.rebalance.pricing import free_devices
from controlplane.rebalance.selectors import deployment_ids_to_evaluate
from controlplane.rebalance.services import Observed, rebalance_observe, rebalance_settle

logger = logging.getLogger(__name__)


def rebalance_pass(*, now: float | None = None) -> dict[int, str | None]:
    """Every READY deployment whose policy is not off: observed, the free cards shared among competing
    scale-outs, then each decided (highest priority first). Returns each decided deployment's
    outcome (``rebalance_evaluate``'s). One deployment's failure does not starve the others."""
    now = time.time() if now is None else now
    observed: list[Observed] = []
    for deployment_id in deployment_ids_to_evaluate():
        try:
            found = rebalance_observe(deployment_id=deployment_id, now=now)
        except Exception:
            logger.exception("rebalance policy: deployment %s failed", deployment_id)
            continue
        if found is not None:
            observed.append(found)
    try:
        shares = share_cards(observed)
    except Exception:  # the decisions go on first come, first served
        logger.exception("rebalance policy: sharing the free cards failed")
        shares = Shares()
    outcomes = {}
    for seen in observed:
        try:
            outcomes[seen.deployment.pk] = rebalance_settle(
                observed=shares.told(seen), now=now, withheld=shares.withheld(seen.deployment.pk))
        except Exception:
            logger.exception("rebalance policy: deployment %s failed", seen.deployment.pk)
    return outcomes


@dataclasses.dataclass(frozen=True)
class _Claim:
    claimant: Claimant
    worth: dict[str, CardWorth]
    capacity: float
    utilisation: float | None  # of the applied plan at the forecast load (None: unbounded)


@dataclasses.dataclass(frozen=True)
class Shares:
    """The joint assignment of one pass: ``given`` maps a free card to the deployment id it went to."""

    given: dict[str, int] = dataclasses.field(default_factory=dict)
    claims: dict[int, _Claim] = dataclasses.field(default_factory=dict)
    names: dict[int, str] = dataclasses.field(default_factory=dict)

    def withheld(self, deployment_id: int) -> list[str]:
        """The cards given to other deployments: none of this pass's re-plans of it may use them."""
        return sorted(card for card, owner in self.given.items() if owner != deployment_id)

    def told(self, seen: Observed) -> Observed:
        """A claimant's observation with what it was given, and why, in its occurrence's reason and
        detail (``cards``); any other unchanged."""
        pk = seen.deployment.pk
        if pk not in self.claims:
            return seen
        claim = self.claims[pk]
        mine = {card: claim.worth[card] for card, owner in self.given.items() if owner == pk}
        others = {card: self.names[owner] for card, owner in self.given.items() if owner != pk}
        received = sum(w.tokens_per_s for w in mine.values())
        cards = {"need_tokens_per_s": claim.claimant.need, "priority": claim.claimant.priority,
                 "given": {card: w.as_dict() for card, w in mine.items()},
                 "given_tokens_per_s": round(received, 2), "withheld": others,
                 "worth": {card: round(w.tokens_per_s, 2) for card, w in claim.worth.items()},
                 "competing": sorted(self.names.values())}
        words = ", ".join(f"{card} ({_worth_text(w)})" for card, w in sorted(mine.items())) or "no card"
        high = settings.MOTLEY_REBALANCE_DEMAND_HIGH
        text = (f"free cards shared among {len(self.claims)} deployments scaling out (priority, then "
                f"worth): given {words}, {received:.1f} tokens/s against a need of {claim.claimant.need} "
                f"tokens/s (a forecast load of {_share_text(claim.utilisation)} of the "
                f"{claim.capacity:.1f} its plan serves, brought to {high:g}) at priority "
                f"{claim.claimant.priority}")
        if others:
            text += "; left to the others: " + ", ".join(f"{card} ({name})"
                                                        for card, name in sorted(others.items()))
        occurrence = seen.occurrence
        return dataclasses.replace(seen, occurrence=dataclasses.replace(
            occurrence, reason=f"{occurrence.reason}; {text}", detail={**occurrence.detail, "cards": cards}))


def share_cards(observed: Iterable[Observed]) -> Shares:
    """The free cards shared among scale-outs where they compete (module docstring); nothing given
    where they do not: fewer than two, or no card that two of them could use."""
    wanting = [seen for seen in observed if _scales_out(seen)]
    if len(wanting) < 2:
        return Shares()
    fleet = wanting[0].fleet
    free = free_devices(fleet=fleet)
    claims = {seen.deployment.pk: c for seen in wanting if (c := _claim(seen, fleet, free)) is not None}
    usable = [{card for card, w in c.worth.items() if w.tokens_per_s > 0} for c in claims.values()]
    if not any(a & b for i, a in enumerate(usable) for b in usable[i + 1:]):
        return Shares()
    assignment = assign_whole([c.claimant for c in claims.values()], free,
                              {c.claimant.name: c.worth for c in claims.values()})
    names = {seen.deployment.pk: seen.deployment.name for seen in wanting if seen.deployment.pk in claims}
    return Shares(given={card: int(owner) for card, owner in assignment.items()}, claims=claims, names=names)


def _scales_out(seen: Observed) -> bool:
    """A demand occurrence asking for one replica more (not at ``max_replicas``: that one asks for a
    larger batch on its own cards)."""
    occurrence, deployment = seen.occurrence, seen.deployment
    if occurrence is None or occurrence.trigger != RebalanceProposal.Trigger.DEMAND:
        return False
    most = deployment.max_replicas
    return occurrence.detail["action"] == "out" and (
        most is None or len(deployment.revision.placements) < most)


def _claim(seen: Observed, fleet: FleetSpec, free: list[str]) -> _Claim | None:
    deployment = seen.deployment
    revision = deployment.revision
    try:
        request = request_on_fleet(revision.request, model=revision.model, fleet=fleet,
                                   busy=devices_in_use(deployment=deployment))
    except PlanningError:
        return None  # its own re-plan will say why
    cost = CostModel(request)
    worth = {card: card_worth(request, fleet.device(card), cost) for card in free
             if request.excluded_reason(fleet.device(card)) is None}
    capacity = capacity_of(revision.plan)
    utilisation = seen.occurrence.detail["utilisation"]
    need = (capacity.tokens_per_s * (utilisation / settings.MOTLEY_REBALANCE_DEMAND_HIGH - 1)
            if utilisation is not None else 0.0)
    if need <= 0:  # a measured percentile over its target (or no capacity): one replica like its own
        need = capacity.tokens_per_s / max(1, capacity.replicas)
    claimant = Claimant(str(deployment.pk), deployment.priority, math.ceil(need),
                        {card: int(w.tokens_per_s) for card, w in worth.items()})
    return _Claim(claimant, worth, capacity.tokens_per_s, utilisation)


def _share_text(utilisation: float | None) -> str:
    return "unbounded" if utilisation is None else f"{utilisation:.0%}"


def _worth_text(worth: CardWorth) -> str:
    precision = (f"{worth.low_layers} at int{worth.low_bits}" if worth.low_layers else "all at 16 bits")
    part = f", one of {worth.parts} cards of a replica" if worth.parts > 1 else ""
    return f"{worth.tokens_per_s:.1f} tokens/s, {worth.layers} layers, {precision}{part}"
