"""What-if check of a tensor-parallel group stage's shares (``validate``'s part for ``Placement.group``).

An operator edits the shares by hand, so every rule the planner keeps when it makes them is checked
here with a message that names the rank and the count: ranks on one node linked by NVLink or PCIe,
the key-value heads and MLP columns split whole between them, a 4-bit rank's columns whole int4
groups of the model's (its down projection is quantized in groups along them), each rank's
precision allowed.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from controlplane.planning.cost_model import CostModel
from controlplane.planning.plan import Placement
from controlplane.planning.request import PlanRequest
from controlplane.planning.tensor_parallel import GROUP_LINKS, layout


def group_problems(request: PlanRequest, cost: CostModel, known, p: Placement,
                   where: str) -> Iterator[tuple[str, str]]:
    """(code, message) of every problem of the group stage ``p`` (none for a stage on one card);
    ``known``: the fleet's devices by name, ``where``: how messages name the stage."""
    if not p.group:
        return
    lay = layout(request.model)
    if lay is None:
        yield "bad_group", (f"{where}: model {request.model.name}'s profile does not say its heads and MLP "
                            f"size, so its layers cannot be split into a tensor-parallel group")
        return
    ranks = [f"rank {i} ({share.device})" for i, share in enumerate(p.group)]
    if len(p.group) < 2:
        yield "bad_group", f"{where}: a tensor-parallel group needs two or more ranks, it has {len(p.group)}"
    if p.group[0].device != p.device:
        yield "bad_group", f"{where}: the group's first rank is {p.group[0].device}, not the stage's device"
    devices = [share.device for share in p.group]
    for name in sorted({d for d in devices if devices.count(d) > 1}):
        yield "bad_group", f"{where}: {name} is {devices.count(name)} ranks of the group"
    unknown = [rank for rank, share in zip(ranks, p.group) if share.device not in known]
    for rank in unknown:
        yield "unknown_device", f"{where}: {rank}: no such device in fleet {request.fleet.name}"
    if not unknown:
        yield from _placement(request, cost, known, p, ranks, where)
    yield from _counts(request, lay, p, ranks, where)


def _placement(request: PlanRequest, cost: CostModel, known, p: Placement, ranks: list[str], where: str):
    """Every rank available, on the first rank's node, every two ranks linked by NVLink or PCIe."""
    for rank, share in zip(ranks, p.group):
        reason = request.excluded_reason(known[share.device]) if share.device != p.device else None
        if reason:
            yield "device_unavailable", f"{where}: {rank} is {reason}"
    node = known[p.group[0].device].node
    away = [(rank, known[s.device].node) for rank, s in zip(ranks, p.group) if known[s.device].node != node]
    for rank, other in away:
        yield "bad_group", (f"{where}: {rank} is on node {other}, not on {node} with the group's first "
                            f"rank: a group's ranks share one node")
    if away:
        return
    for a, b in itertools.combinations(p.group, 2):
        kind = cost.link(known[a.device], known[b.device]).kind
        if kind not in GROUP_LINKS:
            yield "bad_group", (f"{where}: {a.device} and {b.device} are linked by {kind}, a group needs "
                                f"{' or '.join(GROUP_LINKS)}")


def _counts(request: PlanRequest, lay, p: Placement, ranks: list[str], where: str):
    """Heads and columns: at least one each per rank, summing to the model's; precisions allowed."""
    offsets = list(itertools.accumulate((share.columns for share in p.group), initial=0))
    for rank, share, first, end in zip(ranks, p.group, offsets, offsets[1:]):
        if share.kv_heads < 1 or share.columns < 1:
            yield "bad_group", (f"{where}: {rank} holds {share.kv_heads} kv heads and {share.columns} MLP "
                                f"columns; every rank holds at least one of each")
        if share.bits not in (16, 8, 4):
            yield "bad_group", f"{where}: {rank} at {share.bits} bits; a rank is at 16, 8 or 4 bits"
        elif share.bits not in request.bits:
            yield "precision_not_allowed", (f"{where}: {rank} at {share.bits} bits, not in the allowed "
                                            f"{list(request.bits)}")
        # Whole groups of the model's own grouping: a rank starts on a group's first column and ends
        # on a group's last or at the intermediate size (the model's last group may be short).
        int4 = share.bits == 4 or (p.low_bits == 4 and p.split < p.end)
        if int4 and (first % lay.block or (end % lay.block and end != lay.columns)):
            yield "bad_group", (f"{where}: {rank} holds MLP columns [{first}, {end}) at 4 bits, not whole "
                                f"int4 groups of {lay.block} (each rank's columns a multiple of {lay.block})")
    heads = sum(share.kv_heads for share in p.group)
    if heads != lay.kv_heads:
        yield "bad_group", (f"{where}: the ranks' kv heads sum to {heads}, the model has {lay.kv_heads} "
                            f"({'+'.join(str(s.kv_heads) for s in p.group)})")
    columns = sum(share.columns for share in p.group)
    if columns != lay.columns:
        yield "bad_group", (f"{where}: the ranks' MLP columns sum to {columns}, the model's intermediate "
                            f"size is {lay.columns} ({'+'.join(str(s.columns) for s in p.group)})")
