"""Where a speculative-decoding draft model runs: a spare card, at the precision that proposes fastest.

A draft model shares the target's tokenizer and runs as its own one-stage pipeline (the whole model on
one card, worker_runtime/draft_client.py); the target's head asks it for ``proposals`` tokens per
verification step. Its price per step and sequence is

    propose_s = proposals x decode step of the whole draft at micro-batch 1 on its card
                + 2 x the latency of the link between its card and the target's head card

(the token ids going there and the proposals coming back; 0 on the same card). The decode step is the
cost model's (``cost_model.py``) for the draft's profile with the request's fleet and workload.

Candidates are the eligible cards that carry no stage of the target (a draft sharing a card would
slow that stage) and hold the whole draft at some allowed precision with a KV pool of at least
batch x context tokens (``contracts.footprint``, as the agent admits it). The draft's precision
lowers its acceptance rate, never the output (the target verifies every token), so it has its own
quality budget: with ``max_kl`` a low precision needs the draft's measured per-layer KL there summed
within ``max_kl``; without a measurement only 16 and 8 bits are allowed. The fastest (card, bits)
wins; at equal times a card on the head's node, then the slower card (old cards are the ones to
spend on drafts), then the name, then the higher precision.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from contracts.footprint import usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_profile import ModelProfile
from controlplane.planning.cost_model import CostModel
from controlplane.planning.ordering import speed
from controlplane.planning.plan import Placement, ReplicaPlan
from controlplane.planning.quality_budget import within_kl
from controlplane.planning.request import PlanningError, PlanRequest
from controlplane.planning.speculation import Speculation

KV_TOKENS_CAP = 2**53  # as evaluate.py caps a stage whose layers cache nothing
ALTERNATIVES_SHOWN = 4  # other cards' best propose times named in the reasons


@dataclass(frozen=True)
class DraftPlan:
    """The draft's stage and its prices: ``placement`` is the whole draft model on one card, one stage
    of a one-replica plan."""

    placement: Placement
    kv_tokens: int  # the draft's KV pool: what its card holds beside the weights, >= batch x context
    propose_s: float  # ``proposals`` tokens for one sequence, with the round trip to the head
    decode_s: float  # one decode step of the draft at micro-batch 1 on its card
    round_trip_s: float  # token ids to the draft's card and the proposals back to the head
    reasons: tuple[str, ...]  # lines for the plan's explanation


@dataclass(frozen=True)
class _Candidate:
    device: DeviceSpec
    bits: int
    kv_tokens: int
    decode_s: float
    round_trip_s: float
    propose_s: float
    same_node: bool

    def key(self) -> tuple:
        return (self.propose_s, not self.same_node, speed(self.device), self.device.name, -self.bits)


def place_draft(request: PlanRequest, replicas: Sequence[ReplicaPlan | Sequence[Placement]],
                draft: ModelProfile, proposals: int) -> DraftPlan:
    """The card and precision of ``draft`` for the target placed as ``replicas`` (the plan's
    ``ReplicaPlan``s or each replica's placements, ``serialize.replica_placements``); PlanningError
    naming each card's reason when no card can take it."""
    if proposals < 1:
        raise PlanningError(f"draft: proposals {proposals!r} must be at least 1")
    stages = [tuple(r.stages if isinstance(r, ReplicaPlan) else r) for r in replicas]
    if not stages or not stages[0]:
        raise PlanningError("draft: the target has no stages to place a draft beside")
    # The draft's own prices: its profile, the same fleet and workload; the target's quality rules,
    # pins and speculation are not the draft's.
    cost = CostModel(replace(request, model=draft, max_kl=None, pins=(), speculation=Speculation()))
    try:
        head = cost.device(stages[0][0].device)
    except KeyError:
        raise PlanningError(f"draft: the target's head card {stages[0][0].device!r} is not in the fleet "
                            f"{request.fleet.name}") from None
    used = {device for replica in stages for s in replica
            for device in (s.device, *(share.device for share in s.group))}  # a group's every rank
    allowed, refused = _allowed_bits(request, draft)
    candidates, unfit = [], []
    for device in request.fleet.devices:
        reason = request.excluded_reason(device)
        if reason is None and device.name in used:
            reason = "carries a stage of the target"
        if reason is None:
            fits = [c for c in (_candidate(cost, device, head, bits, proposals) for bits in allowed) if c]
            candidates.extend(fits)
            if not fits:
                reason = _too_small(cost, device, allowed)
        if reason is not None:
            unfit.append((device.name, reason))
    if not candidates:
        unfit_text = "; ".join(f"{name}: {why}" for name, why in unfit)
        refused_text = "".join(f" {line}" for line in refused)
        raise PlanningError(f"draft: no card can serve {draft.name}: {unfit_text}.{refused_text}")
    best = min(candidates, key=_Candidate.key)
    return DraftPlan(placement=Placement(best.device.name, 0, draft.num_layers, best.bits),
                     kv_tokens=best.kv_tokens, propose_s=best.propose_s, decode_s=best.decode_s,
                     round_trip_s=best.round_trip_s,
                     reasons=_reasons(request, draft, proposals, head, best, candidates, refused, unfit))


def _allowed_bits(request: PlanRequest, draft: ModelProfile) -> tuple[list[int], list[str]]:
    """The request's precisions the draft may run at, and a line per refused one."""
    allowed, refused = [], []
    for bits in request.sorted_bits:
        measured = len(draft.sensitivity.get(bits, ())) == draft.num_layers
        if bits == 16 or request.max_kl is None:
            allowed.append(bits)
        elif measured:
            whole = Placement("", 0, draft.num_layers, bits)
            if within_kl([whole], draft.sensitivity, request.max_kl, (bits,)):
                allowed.append(bits)
            else:
                kl = sum(draft.sensitivity[bits])
                refused.append(f"{bits} bits refused: the draft's measured KL there sums to {kl:.4g}, over "
                               f"max_kl {request.max_kl:.4g}.")
        elif bits == 8:
            allowed.append(bits)
            refused.append("8 bits allowed without a measured KL of the draft (a draft's precision lowers "
                           "its acceptance, never the output).")
        else:
            refused.append(f"{bits} bits refused: no measured KL of the draft at {bits} bits (run manage.py "
                           f"profile_quality {draft.name}); without it a draft runs at 16 or 8 bits.")
    return allowed, refused


def _candidate(cost: CostModel, device: DeviceSpec, head: DeviceSpec, bits: int,
               proposals: int) -> _Candidate | None:
    """The draft at ``bits`` on ``device``, priced; None when it does not fit with the workload's KV."""
    whole = Placement(device.name, 0, cost.num_layers, bits)
    kv_tokens = min(cost.memory(device, whole).kv_tokens, KV_TOKENS_CAP)
    if kv_tokens < cost.kv_required:
        return None
    decode = cost.decode_s(device, whole, 1)
    round_trip = 0.0 if device.name == head.name else 2 * cost.link(device, head).latency_us * 1e-6
    return _Candidate(device, bits, int(kv_tokens), decode, round_trip, proposals * decode + round_trip,
                      device.node == head.node)


def _too_small(cost: CostModel, device: DeviceSpec, allowed: Sequence[int]) -> str:
    if not allowed:
        return "no precision is allowed for the draft"
    if usable_bytes(device) <= 0:
        return "no free memory"
    low = min(allowed)
    need = cost.memory(device, Placement(device.name, 0, cost.num_layers, low)).holding(cost.kv_required)
    return (f"too small at every allowed precision ({need / GIB:.1f} GiB at {low} bits with "
            f"{cost.kv_required} tokens of KV, {usable_bytes(device) / GIB:.1f} GiB usable)")


def _reasons(request: PlanRequest, draft: ModelProfile, proposals: int, head: DeviceSpec, best: _Candidate,
             candidates: Sequence[_Candidate], refused: Sequence[str],
             unfit: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    device = best.device
    where = "the head's node" if best.same_node else f"node {device.node}, not the head's ({head.node})"
    lines = [
        f"Draft model {draft.name}: {device.name} ({device.model}, {where}), all {draft.num_layers} layers "
        f"at {best.bits} bits; {best.propose_s * 1e3:.3f} ms to propose {proposals} tokens for a sequence "
        f"({proposals} x {best.decode_s * 1e3:.3f} ms decode steps + {best.round_trip_s * 1e3:.3f} ms round "
        f"trip to the head {head.name}).",
        f"Draft KV: {best.kv_tokens} tokens on {device.name} for the {request.workload.kv_tokens_required} "
        f"the workload needs ({request.workload.batch} x {request.workload.context}).",
    ]
    ties = [c for c in candidates if c.propose_s == best.propose_s and c.device.name != device.name]
    why = f"Why: the fastest to propose of {len(candidates)} spare (card, precision) choices"
    if ties:
        why += (f"; as fast as {', '.join(sorted({c.device.name for c in ties}))}, chosen for being on the "
                "head's node, then the slower card (old cards are the ones to spend on drafts)")
    lines.append(why + ".")
    others: dict[str, _Candidate] = {}
    for c in sorted(candidates, key=_Candidate.key):
        if c.device.name != device.name:
            others.setdefault(c.device.name, c)
    if others:
        shown = list(others.values())[:ALTERNATIVES_SHOWN]
        more = f" and {len(others) - len(shown)} more" if len(others) > len(shown) else ""
        priced = (f"{c.device.name} at {c.bits} bits {c.propose_s * 1e3:.3f} ms" for c in shown)
        lines.append("Alternatives: " + ", ".join(priced) + more + ".")
    lines.extend(refused)
    if unfit:
        lines.append("Not candidates: " + "; ".join(f"{name} ({why})" for name, why in unfit) + ".")
    return tuple(lines)
