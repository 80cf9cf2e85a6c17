"""How many pipeline replicas, and which devices each one gets.

Replicas are disjoint device sets that each hold the whole model and serve their own batch. Two
ways to split the fleet are tried for every replica count and the better plan kept:

* ``contiguous``: cut the topology order (node-major) into runs of about equal memory, so a replica
  stays within a node or crosses few network links;
* ``dealt``: deal devices, fastest first and in snake order, so replicas get similar mixes of new
  and old cards (balanced throughput when nodes are heterogeneous).

"auto" keeps adding replicas while total throughput rises: counts double until two in a row bring
no gain, then a local search halves its step around the best count. Counts start where groups are
no larger than a pipeline can use (``useful_group_size``): more stages than micro-batches (at most
the batch) or than layers only add hops, unless memory needs them. Groups that
cannot hold the model are left idle, so a count is judged by the replicas it really yields.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

from contracts.hardware import DeviceSpec, FleetSpec
from controlplane.planning.ordering import speed, topology_order

SPLITS = ("contiguous", "dealt")


Result = TypeVar("Result")


def best_count(attempt: Callable[[int], Result | None], better: Callable[[Result, Result], bool],
               lower: int, limit: int) -> int:
    """The replica count in [lower, limit] whose plan is best, by doubling from ``lower`` then a
    shrinking local search (from 1 when ``lower`` replicas cannot all be planned)."""
    def wins(count: int, incumbent: int) -> bool:
        found, held = attempt(count), attempt(incumbent)
        return found is not None and (held is None or better(found, held))

    if attempt(lower) is None:
        lower = 1
    best, count, declines = lower, 2 * lower, 0
    while count <= limit and declines < 2:
        if wins(count, best):
            best, declines = count, 0
        else:
            declines += 1
        count *= 2
    step = max(1, best // 2)
    while True:
        for count in (best - step, best + step):
            if lower <= count <= limit and wins(count, best):
                best = count
        if step == 1:
            return best
        step //= 2


def useful_group_size(batch: int, num_layers: int, devices_for_memory: int) -> int:
    """Largest replica worth planning: twice what the micro-batches or the memory need."""
    return 2 * max(min(batch, num_layers), devices_for_memory)


def split(devices: Sequence[DeviceSpec], fleet: FleetSpec, replicas: int, how: str,
          first: Sequence[str] = ()) -> list[list[DeviceSpec]]:
    """``replicas`` disjoint groups covering ``devices``; devices named in ``first`` go to group 0."""
    ordered = topology_order(devices, fleet)
    if how == "contiguous":
        groups = _contiguous(ordered, replicas)
    else:
        groups = _dealt(ordered, replicas)
    if first:
        pinned = [d for d in ordered if d.name in first]
        groups = [[d for d in g if d.name not in first] for g in groups]
        groups[0] = groups[0] + pinned
        groups = [groups[0]] + [g for g in groups[1:] if g]
    return [topology_order(g, fleet) for g in groups if g]


def _contiguous(ordered: list[DeviceSpec], replicas: int) -> list[list[DeviceSpec]]:
    total = sum(d.memory_bytes for d in ordered)
    groups: list[list[DeviceSpec]] = [[] for _ in range(replicas)]
    running = 0
    for position, device in enumerate(ordered):
        remaining_devices = len(ordered) - position
        index = min(replicas - 1, int(running * replicas / total))
        # Never leave a later group empty: the last devices go one per group if they must.
        index = max(index, replicas - remaining_devices)
        groups[index].append(device)
        running += device.memory_bytes
    return groups


def _dealt(ordered: list[DeviceSpec], replicas: int) -> list[list[DeviceSpec]]:
    ranked = sorted(ordered, key=lambda d: (-speed(d), -d.memory_bytes, d.name))
    groups: list[list[DeviceSpec]] = [[] for _ in range(replicas)]
    for position, device in enumerate(ranked):
        lap, offset = divmod(position, replicas)
        groups[offset if lap % 2 == 0 else replicas - 1 - offset].append(device)
    return groups
