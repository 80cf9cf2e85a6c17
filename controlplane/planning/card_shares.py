"""Which deployment gets which free card when several want more than the fleet has: a joint assignment
instead of first come, first served.

Each claimant says how much it needs (tokens/s of forecast load its plan does not cover) and what each
card is worth to it: the tokens/s the card adds at the best precision its quality budget allows, zero
where its layers cannot fit. So an old card is worth more to a model that may run it at int4 than to one
whose budget keeps it at 16 bits. The assignment maximises, lexicographically:

1. the need met of the highest priority (the sum over its claimants of ``min(need, worth received)``),
   then of the next priority, and so on;
2. then uses the fewest cards (a card nobody needs stays free).

``greedy`` is the order it replaces (by priority, each takes the cards worth most to it until its need
is met); ``assign`` finds the optimum by dynamic programming over the cards, whose state is what each
claimant has received so far capped at its need (the objective depends on nothing else), so it is exact
and its cost grows with the distinct states reached, not with every assignment.

Those states are what each claimant received, so with worths in raw tokens/s they multiply past use on
a real fleet's free cards (three claimants and 21 free cards of cluster-64: minutes). ``in_steps``
counts each claimant's need and worths in steps of a twentieth of its need: at most 21 states a
claimant, and a quarter of a second for that case, exact at that resolution.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NEED_STEPS = 20  # the resolution of ``in_steps``: a claimant's need is this many steps


@dataclass(frozen=True)
class Claimant:
    name: str
    priority: int
    need: int  # tokens/s wanted
    worth: Mapping[str, int]  # card name -> tokens/s it adds to this claimant (absent or 0: unusable)


Assignment = dict[str, str]  # card -> claimant


def score(claimants: Sequence[Claimant], assignment: Assignment) -> tuple:
    """The objective: need met per priority (highest first), then minus the cards used."""
    got = {c.name: 0 for c in claimants}
    for card, name in assignment.items():
        got[name] += next(c for c in claimants if c.name == name).worth.get(card, 0)
    levels = sorted({c.priority for c in claimants}, reverse=True)
    met = tuple(sum(min(c.need, got[c.name]) for c in claimants if c.priority == level) for level in levels)
    return (*met, -len(assignment))


def greedy(claimants: Sequence[Claimant], cards: Sequence[str]) -> Assignment:
    """First come, first served by priority: each takes the free cards worth most to it until its need
    is met."""
    free, assignment = list(cards), {}
    for claimant in sorted(claimants, key=lambda c: -c.priority):
        got = 0
        for card in sorted(free, key=lambda k: -claimant.worth.get(k, 0)):
            if got >= claimant.need or claimant.worth.get(card, 0) <= 0:
                break
            assignment[card], got = claimant.name, got + claimant.worth[card]
            free.remove(card)
    return assignment


def assign(claimants: Sequence[Claimant], cards: Sequence[str]) -> Assignment:
    """The joint optimum of ``score`` (module docstring)."""
    start = tuple(0 for _ in claimants)
    states: dict[tuple[int, ...], Assignment] = {start: {}}  # received (capped) -> fewest-card assignment
    for card in cards:
        following = dict(states)
        for received, assignment in states.items():
            for i, claimant in enumerate(claimants):
                worth = claimant.worth.get(card, 0)
                if worth <= 0 or received[i] >= claimant.need:
                    continue  # unusable, or already met: a card more would only be used for nothing
                after = (*received[:i], min(claimant.need, received[i] + worth), *received[i + 1:])
                kept = following.get(after)
                if kept is None or len(assignment) + 1 < len(kept):
                    following[after] = {**assignment, card: claimant.name}
        states = following
    return max(states.values(), key=lambda a: score(claimants, a))


def in_steps(claimants: Sequence[Claimant], steps: int = NEED_STEPS) -> list[Claimant]:
    """The claimants with each one's need counted as ``steps`` steps and its worths in the same
    steps, rounded down: a need met in steps is met in tokens/s, so the coarser count never gives a
    higher priority less than it needs (a card worth under a step of a claimant's need is worth
    nothing to it); a claimant with no need keeps none."""
    counted = []
    for claimant in claimants:
        step = claimant.need / steps if claimant.need > 0 else None
        worth = {card: math.floor(value / step + 1e-9) if step else 0
                 for card, value in claimant.worth.items()}
        counted.append(Claimant(claimant.name, claimant.priority, steps if step else 0, worth))
    return counted
