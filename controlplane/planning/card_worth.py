"""What a free card is worth to a deployment: the decode tokens/s it adds, at the best precision the
deployment's quality budget allows, for the joint assignment of cards to models (``card_shares``).

The price is the roofline cost model's (``CostModel``), one request and one card at a time, with no
planner search, so that a policy pass can price every free card for every deployment that wants
more:

- a replica made of ``k`` cards like it gives each ``ceil(n / k)`` of the model's ``n`` layers
  (``[0, L)``: a replica's first stage, the embedding counted; with ``k = 1`` the whole model and
  its head), which must fit the card's usable memory with the KV of the request's whole batch at
  full context, as the planner's stages must;
- at each precision allowed: 16 bits, and each lower one with the card's share of one replica's
  quality budget, in proportion to the layers it holds (``low_layer_budget``: the count form's
  ``max_quantized``, or in the measured form the most layers, least sensitive first, whose summed
  KL stays within ``max_kl``), the low-bit layers last as the planner places them;
- a decode step of those layers at the whole batch takes ``T`` (``CostModel.split_times``: memory,
  FLOPs, overheads, calibration and throttling of that card). A memory-bound decode round is about
  the sum of the stages' steps, so the replica serves ``batch / (k * T)`` tokens/s, and each of its
  ``k`` cards is worth ``batch / (k**2 * T)``. The fewest cards that fit give the most (the
  ``k`` worth most is kept), then the precision worth most; a card that cannot hold one layer is
  worth 0.

A card that holds the whole model is worth the planner's one-card replica; ``k`` alike cards add up
to the replica they form, and so, about, do mixed ones (the round is a sum either way). A card is
counted as a whole part of a replica: two that each hold three quarters of the model are worth
one replica between them, not the room they have left.

So an old card with little memory and bandwidth is worth more to a model allowed int4 (it holds more
layers and reads fewer bytes a step) than to one held at 16 bits. The figure is an estimate for
choosing who gets which card, not a plan: the deployment's re-plan on the cards it is given decides
what it serves (docs/planner.md, "Several models on one fleet").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from contracts.hardware import DeviceSpec
from controlplane.planning.card_shares import Assignment, Claimant, assign, greedy, in_steps, score
from controlplane.planning.cost_model import CostModel
from controlplane.planning.request import PlanRequest


@dataclass(frozen=True)
class CardWorth:
    device: str
    tokens_per_s: float  # 0: the card cannot hold one layer
    layers: int  # decoder layers it holds at that worth
    low_bits: int  # the precision of its low-bit layers (16: none)
    low_layers: int
    parts: int = 1  # cards of a replica of cards like it (1: it holds the whole model)

    def as_dict(self) -> dict:
        return {"tokens_per_s": round(self.tokens_per_s, 2), "layers": self.layers,
                "low_bits": self.low_bits, "low_layers": self.low_layers, "parts": self.parts}


def low_layer_budget(request: PlanRequest, low_bits: int) -> int:
    """Decoder layers of one replica that may run at ``low_bits`` within the request's quality budget."""
    if low_bits not in request.bits:
        return 0
    if request.measured:  # the least sensitive layers first, while their summed KL stays within max_kl
        kl = np.cumsum(sorted(request.model.sensitivity[low_bits]))
        return int(np.searchsorted(kl, request.max_kl + 1e-12, side="right"))
    return request.quantized_layer_budget


def card_worth(request: PlanRequest, device: DeviceSpec, cost: CostModel | None = None) -> CardWorth:
    """The tokens/s ``device`` adds to a deployment planned with ``request`` (module docstring);
    ``cost`` is the request's cost model, shared across the cards priced for one request."""
    cost = cost or CostModel(request)
    n, batch = cost.num_layers, cost.batch
    held = np.arange(1, n + 1)
    best = CardWorth(device.name, 0.0, 0, 16, 0)
    options = [(16, np.zeros(n, dtype=int))] if 16 in request.bits else []
    for low_bits in (b for b in request.sorted_bits if b < 16):
        budget = low_layer_budget(request, low_bits) if 16 in request.bits else n
        options.append((low_bits, np.minimum(held, budget * held // n)))
    parts = np.arange(1, n + 1)  # k: the cards of a replica of cards like this one
    layers = -(-n // parts)  # ceil(n / k), each card's share
    for low_bits, low_layers in options:
        times = cost.split_times(device, low_bits, batch, np.zeros(n, dtype=int), held, low_layers)
        times = times[layers - 1]
        worth = np.where(np.isfinite(times), batch / (parts.astype(float) ** 2 * times), 0.0)
        at = int(np.argmax(worth))
        if worth[at] > best.tokens_per_s:
            low = int(low_layers[layers[at] - 1])
            best = CardWorth(device.name, float(worth[at]), int(layers[at]), low_bits if low else 16, low,
                             int(parts[at]))
    return best


def assign_whole(claimants: Sequence[Claimant], cards: Sequence[str],
                 worths: Mapping[str, Mapping[str, CardWorth]]) -> Assignment:
    """``card_shares.assign`` (in steps, ``in_steps``) on worths priced here (``worths``: claimant
    name -> card -> ``CardWorth``), where a card that cannot hold the model alone counts only with
    others to complete a replica: where the parts a claimant was given of that kind add up to less
    than one replica (the sum of ``1 / parts``), they are worth nothing to it and the cards are
    given out again, until every claimant's cards can form replicas. The steps are coarse (a card
    worth under a twentieth of a claimant's need counts nothing to it), so the answer is checked on
    the real figures against the greedy order (``card_shares.score``, either without the cards that
    complete no replica) and the better kept: never worse than first come, first served."""
    remaining = list(claimants)
    while True:
        assignment = assign(in_steps(remaining), cards)
        stranded = _stranded(remaining, assignment, worths)
        if not stranded:
            break
        remaining = [dataclasses.replace(c, worth={card: 0 if (c.name, card) in stranded else value
                                                   for card, value in c.worth.items()})
                     for c in remaining]
    first_come = greedy(claimants, cards)
    first_come = {card: owner for card, owner in first_come.items()
                  if (owner, card) not in _stranded(claimants, first_come, worths)}
    return max((assignment, first_come), key=lambda a: score(claimants, a))


def _stranded(claimants: Sequence[Claimant], assignment: Assignment,
              worths: Mapping[str, Mapping[str, CardWorth]]) -> set[tuple[str, str]]:
    """(claimant, card) for the cards given to a claimant that complete no replica there."""
    found = set()
    for claimant in claimants:
        partial = [card for card, owner in assignment.items()
                   if owner == claimant.name and worths[claimant.name][card].parts > 1]
        if partial and sum(1 / worths[claimant.name][card].parts for card in partial) < 1:
            found |= {(claimant.name, card) for card in partial}
    return found
