"""Degrade, then restore: the largest workload a fleet that lost capacity can still serve.

A lost card can leave too little memory for the plan's replicas of ``batch`` sequences of ``context``
tokens, while the same cards would serve fewer replicas, fewer sequences, or shorter ones. Going down
over that would turn a loss of capacity into an outage, so the controller's re-plan after a loss
(``revisions.py``) asks this search for the largest workload that fits: first the most replicas of
the asked workload (a request that names its replicas; each replica left serves as asked), then, on
one replica, the most sequences at the asked context, and only when not even one fits, one sequence
of the longest context down to ``CONTEXT_FLOOR``. Each search is a binary search on the planner's
feasibility (fewer replicas, sequences or shorter ones never need more memory), so it costs a handful
of planner calls. The revision planned on it keeps the request it
stands in for (``PlanRevision.degraded_from``); the reconcile loop plans that again once it fits and
restores the full plan, at its own precision.

Lower precision comes last, and only where the operator allows it: a deployment's
``emergency_max_kl`` (null: not allowed) is a measured quality budget, the summed KL of the layers run
below 16 bits (the model's ``sensitivity``, from ``manage.py profile_quality``). When not even one
sequence of ``CONTEXT_FLOOR`` tokens fits at the plan's own precision, the same search runs again, from
the full workload down, on the request with that budget in place of the plan's (``emergency_request``).
Last rather than first because precision costs every answer some quality while fewer sequences cost
only queueing, and the operator's budget is for keeping the model up, not for keeping its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contracts.model_profile import ModelProfile
from controlplane.planning import Plan, PlanningError, Workload, stored_plan
from controlplane.planning.quality_budget import plan_kl

LOW_BITS = (8, 4)

# Below this many tokens a sequence holds no useful conversation: the model is better off down.
CONTEXT_FLOOR = 256


def workload_of(request: Mapping[str, Any]) -> tuple[int, int]:
    """A stored request's batch and context (the planner's defaults where it sets none)."""
    default = Workload()
    return int(request.get("batch") or default.batch), int(request.get("context") or default.context)


def workload_shown(request: Mapping[str, Any]) -> dict[str, Any]:
    """A stored request's workload as the API, the events and the page show it: ``batch``, ``context``
    and ``replicas`` (a number, or "auto" where the planner picks them)."""
    batch, context = workload_of(request)
    return {"batch": batch, "context": context, "replicas": request.get("replicas") or "auto"}


def workload_text(planned: Mapping[str, Any], asked: Mapping[str, Any]) -> str:
    """``planned`` against ``asked`` in words: "batch 6 of 8, context 256 of 256", and the replicas
    where they differ."""
    text = f"batch {planned['batch']} of {asked['batch']}, context {planned['context']} of {asked['context']}"
    replicas = planned.get("replicas"), asked.get("replicas")
    return text if replicas[0] == replicas[1] else f"replicas {replicas[0]} of {replicas[1]}, {text}"


def degraded_workload(revision) -> dict | None:
    """What a revision serves against what was asked, ``{"planned": {"batch", "context", "replicas"},
    "asked": …, "precision": lowered_precision(…)}``, for the API, the events and the Deployments page;
    None for a revision that is not degraded."""
    if revision.degraded_from is None:
        return None
    return {"planned": workload_shown(revision.request), "asked": workload_shown(revision.degraded_from),
            "precision": lowered_precision(revision.request, revision.degraded_from, revision.plan,
                                           ModelProfile.from_dict(revision.model.profile))}


def measured_low_bits(profile: ModelProfile) -> tuple[int, ...]:
    """The precisions below 16 bits at which the model's per-layer KL was measured for every layer."""
    return tuple(b for b in LOW_BITS if len(profile.sensitivity.get(b, ())) == profile.num_layers)


def emergency_request(
    asked: Mapping[str, Any], *, max_kl: float, low_bits: tuple[int, ...],
) -> dict[str, Any]:
    """``asked`` on the emergency quality budget: 16 bits where it allows them, and each measured low
    precision (``low_bits``), the low-bit layers' summed KL at most ``max_kl``; it replaces the plan's
    own budget (a count or a smaller ``max_kl``)."""
    keep_16 = 16 in (asked.get("bits") or (16,))
    return {**asked, "bits": [16] * keep_16 + list(low_bits), "quality": {"max_kl": max_kl}}


def lowered_precision(request: Mapping[str, Any], asked: Mapping[str, Any], plan: Mapping[str, Any],
                      profile: ModelProfile) -> dict | None:
    """What a revision planned on the emergency quality budget runs below 16 bits, per replica the
    most: ``{"layers": {bits: count}, "kl": summed KL (null where the profile no longer holds it),
    "max_kl": the budget}``; None when its request keeps the asked precision (or the plan holds no
    stages to count)."""
    if (request.get("quality"), request.get("bits")) == (asked.get("quality"), asked.get("bits")):
        return None
    if (priced := stored_plan(plan)) is None:
        return None
    low = {bits for r in priced.replicas for s in r.stages for _, _, bits in s.segments if bits < 16}
    measured = low <= set(measured_low_bits(profile))  # a profile measured again may lack a precision

    def kl(replica) -> float:
        return plan_kl(replica.stages, profile.sensitivity) if measured else 0.0

    worst = max(priced.replicas, key=lambda r: (kl(r), sum(s.quantized_layers for s in r.stages)))
    layers: dict[int, int] = {}
    for stage in worst.stages:
        for start, end, bits in stage.segments:
            if bits < 16:
                layers[bits] = layers.get(bits, 0) + end - start
    return {"layers": {str(bits): count for bits, count in sorted(layers.items(), reverse=True)},
            "kl": round(kl(worst), 6) if measured else None,
            "max_kl": (request.get("quality") or {}).get("max_kl")}


def precision_text(precision: Mapping[str, Any] | None) -> str:
    """``lowered_precision`` in words, for events and the Deployments page: "" when not lowered."""
    if not precision:
        return ""
    layers = ", ".join(f"{count} layer(s) at {bits} bits" for bits, count in precision["layers"].items())
    kl = "KL unmeasured" if precision["kl"] is None else f"KL {precision['kl']:.4g}"
    return (f"precision lowered: {layers or 'no layer below 16 bits'}, {kl} of the emergency budget "
            f"{precision['max_kl']:.4g}")


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


def degraded_plan(
    asked: Mapping[str, Any], plan_for: Callable[[dict[str, Any]], Plan], *,
    lowered: Mapping[str, Any] | None = None,
) -> tuple[dict, Plan]:
    """The request with the largest workload below ``asked``'s that ``plan_for`` plans (it raises
    PlanningError when a request does not fit), and its plan. ``asked`` itself is known not to fit.
    ``lowered``: ``asked`` on the emergency quality budget (``emergency_request``), searched from the
    full workload down when not even one sequence of ``CONTEXT_FLOOR`` tokens fits ``asked``'s precision.
    PlanningError when nothing does."""
    try:
        return _largest_serving(asked, plan_for, try_asked=False)
    except PlanningError as shrunk:
        if lowered is None:
            raise
        try:
            return _largest_serving(lowered, plan_for, try_asked=True)
        except PlanningError as exc:
            budget = lowered["quality"]["max_kl"]
            raise PlanningError(f"{shrunk}; nor on the emergency quality budget (max_kl {budget:.4g}, "
                                f"{'/'.join(map(str, lowered['bits']))} bits): {exc}") from None


def _largest_serving(
    asked: Mapping[str, Any], plan_for: Callable[[dict[str, Any]], Plan], *, try_asked: bool,
) -> tuple[dict, Plan]:
    """The most replicas of ``asked``'s workload where it names more than one, else (or when not one
    fits) the largest workload of one replica (``_largest_workload``)."""
    replicas = asked.get("replicas")
    if isinstance(replicas, int) and replicas > 1:
        plans: dict[int, tuple[dict, Plan]] = {}

        def fits(r: int) -> bool:
            request = {**asked, "replicas": r}
            try:
                plans[r] = (request, plan_for(request))
            except PlanningError:
                return False
            return True

        if (most := _largest(1, replicas if try_asked else replicas - 1, fits)) is not None:
            return plans[most]
        asked, try_asked = {**asked, "replicas": 1}, False  # one replica of the whole workload: tried
    return _largest_workload(asked, plan_for, try_asked=try_asked)


def _largest_workload(
    asked: Mapping[str, Any], plan_for: Callable[[dict[str, Any]], Plan], *, try_asked: bool,
) -> tuple[dict, Plan]:
    """The most sequences at ``asked``'s context, else one sequence of the longest context that fits;
    ``try_asked``: ``asked``'s own workload first (false where it is known not to fit)."""
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

    most_batch = batch if try_asked else batch - 1
    if (most := _largest(1, most_batch, lambda b: fits(b, context))) is not None:
        return plans[(most, context)]
    if (longest := _largest(min(CONTEXT_FLOOR, context - 1), context - 1, lambda c: fits(1, c))) is not None:
        return plans[(1, longest)]
    reason = failures[-1] if failures else "the plan's workload is already the smallest"
    raise PlanningError(f"not even one sequence of {min(CONTEXT_FLOOR, context)} tokens fits: {reason}")
