"""Degrade, then restore: the largest workload a fleet that lost capacity can still serve.

A lost card can leave too little memory for the plan's ``batch`` sequences of ``context`` tokens,
while the same cards would serve fewer sequences, or shorter ones. Going down over that would turn a
loss of capacity into an outage, so the controller's re-plan after a loss (``revisions.py``) asks
this search for the largest workload that fits: first the most sequences at the asked context, and
only when not even one fits, one sequence of the longest context down to ``CONTEXT_FLOOR``. Each
search is a binary search on the planner's feasibility (fewer sequences or shorter ones never need
more memory), so it costs a handful of planner calls. The revision planned on it keeps the request it
stands in for (``PlanRevision.degraded_from``); the reconcile loop plans that again once it fits and
restores the full plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controlplane.planning import Plan, PlanningError, Workload

# Below this many tokens a sequence holds no useful conversation: the model is better off down.
CONTEXT_FLOOR = 256


def workload_of(request: Mapping[str, Any]) -> tuple[int, int]:
    """A stored request's batch and context (the planner's defaults where it sets none)."""
    default = Workload()
    return int(request.get("batch") or default.batch), int(request.get("context") or default.context)


def degraded_workload(request: Mapping[str, Any], degraded_from: Mapping[str, Any] | None) -> dict | None:
    """What a revision serves against what was asked, ``{"planned": {"batch", "context"}, "asked": …}``,
    for the API and the Deployments page; None for a revision that is not degraded."""
    if degraded_from is None:
        return None
    (batch, context), (asked_batch, asked_context) = workload_of(request), workload_of(degraded_from)
    return {"planned": {"batch": batch, "context": context},
            "asked": {"batch": asked_batch, "context": asked_context}}


def with_workload(request: Mapping[str, Any], *, batch: int, context: int) -> dict[str, Any]:
    """The request asking for ``batch`` sequences of ``context`` tokens (a typical prompt, if it states
    one, no longer than the context)."""
    changed = {**request, "batch": batch, "context": context}
    if changed.get("prompt_tokens") is not None:
        changed["prompt_tokens"] = min(int(changed["prompt_tokens"]), context)
    return changed


def _largest(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in [low, high] for which ``fits`` (monotone: true up to some n, false after);
    None when none does."""
    if low > high or not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def degraded_plan(asked: Mapping[str, Any], plan_for: Callable[[dict[str, Any]], Plan]) -> tuple[dict, Plan]:
    """The request with the largest workload below ``asked``'s that ``plan_for`` plans (it raises
    PlanningError when a request does not fit), and its plan. ``asked`` itself is known not to fit.
    PlanningError when not even one sequence of ``CONTEXT_FLOOR`` tokens does."""
    batch, context = workload_of(asked)
    plans: dict[tuple[int, int], tuple[dict, Plan]] = {}
    failures: list[PlanningError] = []

    def fits(b: int, c: int) -> bool:
        request = with_workload(asked, batch=b, context=c)
        try:
            plans[(b, c)] = (request, plan_for(request))
        except PlanningError as exc:
            failures.append(exc)
            return False
        return True

    if (most := _largest(1, batch - 1, lambda b: fits(b, context))) is not None:
        return plans[(most, context)]
    if (longest := _largest(min(CONTEXT_FLOOR, context - 1), context - 1, lambda c: fits(1, c))) is not None:
        return plans[(1, longest)]
    reason = failures[-1] if failures else "the plan's workload is already the smallest"
    raise PlanningError(f"not even one sequence of {min(CONTEXT_FLOOR, context)} tokens fits: {reason}")
