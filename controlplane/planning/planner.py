"""``plan(request)``: the replica count, each replica's devices, order, partition and precisions.

The search, outermost first (docs/planner.md explains each step):
1. eligible devices: not down, not excluded; refuse early with the memory shortfall if the whole
   fleet cannot hold one copy of the model even at the lowest allowed precision;
2. replica counts (``replicas``) and two ways to split devices into groups;
3. per group: device order (``ordering``), then an exact partition for each micro-batch regime
   (``partition``); the group's plan is the one with the shortest decode round;
4. figures (``evaluate``) and the explanation (``explain``).
Groups that look alike (same cards, same link structure) are planned once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from contracts.footprint import usable_bytes
from contracts.hardware import DeviceSpec
from controlplane.planning.cost_model import CostModel, device_key
from controlplane.planning.evaluate import (
    assemble,
    evaluate_replica,
    micro_batch_size,
    network_hops,
    round_seconds,
)
from controlplane.planning.explain import explain, infeasible_message, min_replica_bytes, unused_devices
from controlplane.planning.joint import joint_partition
from controlplane.planning.ordering import EXACT_ORDER_LIMIT, candidate_orders, speed, topology_order
from controlplane.planning.partition import bottleneck_partition, sum_partition, sum_partition_kl
from controlplane.planning.plan import Placement, Plan
from controlplane.planning.quality_budget import (
    KL_UNITS,
    THROUGHPUT_TOLERANCE,
    has_sensitivity,
    kl_prefix_units,
    plan_kl,
    quantized_layers,
)
from controlplane.planning.replicas import SPLITS, best_count, split, useful_group_size
from controlplane.planning.request import PlanningError, PlanRequest


@dataclass(frozen=True)
class _GroupPlan:
    placements: tuple[Placement, ...]
    micro_batches: int
    round_s: float


def plan(request: PlanRequest) -> Plan:
    """The best plan for the request; ``PlanningError`` with the reason when none fits."""
    cost = CostModel(request)
    devices = _eligible(request)
    if min_replica_bytes(request, cost) > sum(usable_bytes(d) for d in devices):
        raise PlanningError(infeasible_message(request, cost, devices))
    search = _Search(cost, request, exact=len(devices) <= EXACT_ORDER_LIMIT)
    pinned = tuple(p.device for p in request.pins)
    tried: dict[int, list[_GroupPlan] | None] = {}

    def attempt(count: int) -> list[_GroupPlan] | None:
        if count not in tried:
            found = None
            for how in SPLITS[:1] if count == 1 else SPLITS:
                planned = search.groups(split(devices, request.fleet, count, how, pinned),
                                        require_all=request.replicas != "auto")
                if planned is not None and (found is None or search.better(planned, found)):
                    found = planned
            tried[count] = found
        return tried[count]

    if request.replicas == "auto":
        lower, limit = _count_range(request, cost, devices)
        best = attempt(best_count(attempt, search.better, lower, limit))
    else:
        best = attempt(request.replicas)
        if best is None or len(best) != request.replicas:
            raise PlanningError(f"infeasible: no split of the {len(devices)} usable device(s) into "
                                f"{request.replicas} replicas holds the model in each; "
                                f"try fewer replicas or 'auto'")
    if best is None:
        raise PlanningError(infeasible_message(request, cost, devices))
    replicas = tuple(evaluate_replica(cost, g.placements, g.micro_batches, i) for i, g in enumerate(best))
    lines = explain(request, cost, replicas)
    if request.replicas == "auto":
        totals = {count: sum(cost.batch / g.round_s for g in found)
                  for count, found in sorted(tried.items()) if found is not None}
        lines.insert(1, "Replica count (auto), total tokens/s by device groups tried (groups that cannot "
                     "hold the model stay idle): "
                     + "; ".join(f"{count} groups: {len(tried[count])} replica(s), {tokens:.0f}"
                                 for count, tokens in totals.items()) + ".")
    return assemble(request, cost, "planner", replicas, lines, unused_devices(request, replicas))


def _eligible(request: PlanRequest) -> list[DeviceSpec]:
    for pin in request.pins:
        try:
            device = request.fleet.device(pin.device)
        except KeyError:
            raise PlanningError(f"pin: unknown device {pin.device!r}") from None
        reason = request.excluded_reason(device)
        if reason:
            raise PlanningError(f"pin: device {pin.device} cannot be used ({reason})")
    devices = [d for d in request.eligible_devices() if usable_bytes(d) > 0]
    if not devices:
        raise PlanningError("no usable device: every device is down, excluded or has no free memory")
    return devices


def _count_range(request: PlanRequest, cost: CostModel, devices: list[DeviceSpec]) -> tuple[int, int]:
    """Replica counts worth trying: groups no larger than useful, no more replicas than devices
    nor than copies of the model the fleet's memory holds."""
    need = min_replica_bytes(request, cost)
    capacities = [usable_bytes(d) for d in devices]
    limit = max(1, min(len(devices), int(sum(capacities) // max(need, 1))))
    for_memory = math.ceil(need / min(capacities))
    largest = useful_group_size(cost.batch, cost.num_layers, for_memory)
    if request.tensor_parallel:  # a replica may use a whole node's cards as one group
        nodes: dict[str, int] = {}
        for d in devices:
            nodes[d.node] = nodes.get(d.node, 0) + 1
        largest = max(largest, *nodes.values())
        if request.objective == "latency":  # one replica on the fastest node may be the fastest
            return 1, limit
    return min(limit, max(1, len(devices) // largest)), limit


class _Search:
    """Plans groups of devices; remembers groups that look alike."""

    def __init__(self, cost: CostModel, request: PlanRequest, exact: bool) -> None:
        self.cost = cost
        self.request = request
        self.exact = exact
        self.pins = {p.device: (p.start, p.end) for p in request.pins}
        self._memo: dict[tuple, tuple | None] = {}
        self.kl = (kl_prefix_units(request.model.sensitivity, request.max_kl, request.bits)
                   if request.measured else None)
        self.profiled = has_sensitivity(request.model, request.bits)

    def _quality(self, placements) -> tuple[float, float]:
        """What the quality budget spends, lower first: measured KL in the measured form; else low-bit
        layers, then (a tie-break, 0 without a measured profile) their measured KL."""
        if self.kl is not None:
            return (round(plan_kl(placements, self.request.model.sensitivity), 12), 0.0)
        spent = round(plan_kl(placements, self.request.model.sensitivity), 12) if self.profiled else 0.0
        return (quantized_layers(placements), spent)

    def better(self, a: list[_GroupPlan], b: list[_GroupPlan]) -> bool:
        return self._score(a) < self._score(b)

    def _score(self, groups: list[_GroupPlan]) -> tuple:
        throughput = sum(self.cost.batch / g.round_s for g in groups)
        latency = max(g.round_s for g in groups)
        quantized = max(self._quality(g.placements) for g in groups)  # (count, KL) or (KL, 0)
        if self.request.objective == "latency":
            return (round(latency, 12), -throughput, quantized)
        return (-round(throughput, 6), quantized, latency)

    def groups(self, groups: list[list[DeviceSpec]], require_all: bool) -> list[_GroupPlan] | None:
        """Plans of the groups that can hold the model (the others' devices stay idle); None when
        none can, when ``require_all`` and one cannot, or when the pinned group (the first) cannot."""
        planned = []
        for index, group in enumerate(groups):
            result = self.group(group)
            if result is None and (require_all or (index == 0 and self.pins)):
                return None
            if result is not None:
                planned.append(result)
        return planned or None

    def group(self, devices: list[DeviceSpec]) -> _GroupPlan | None:
        ordered = topology_order(devices, self.request.fleet)
        key = self._signature(ordered)
        if key is not None and key in self._memo:
            found = self._memo[key]
        else:
            found = self._plan_group(ordered)
            if found is not None:
                names = [d.name for d in ordered]
                found = ([(names.index(p.device), tuple(names.index(s.device) for s in p.group))
                          for p in found[0]], found)
            if key is not None:
                self._memo[key] = found
        if found is None:
            return None
        positions, (placements, micro_batches) = found
        placements = tuple(
            replace(p, device=ordered[i].name,
                    group=tuple(replace(s, device=ordered[k].name) for s, k in zip(p.group, ranks)))
            for (i, ranks), p in zip(positions, placements))
        return _GroupPlan(placements, micro_batches, round_seconds(self.cost, placements, micro_batches))

    def _signature(self, ordered: list[DeviceSpec]) -> tuple | None:
        """Groups with equal signatures get equal plans (up to device names)."""
        if any(d.name in self.pins for d in ordered):
            return None
        fleet = self.request.fleet
        nodes: dict[str, int] = {}
        islands: dict[tuple, int] = {}
        devices = tuple((device_key(d), nodes.setdefault(d.node, len(nodes)),
                         d.nvlink_island and islands.setdefault((d.node, d.nvlink_island), len(islands)),
                         fleet.node(d.node).network_bandwidth_gbs, speed(d)) for d in ordered)
        pairs = ([(a, b) for a in ordered for b in ordered if a is not b] if len(ordered) <= EXACT_ORDER_LIMIT
                 else list(zip(ordered, ordered[1:])))
        links = tuple((link.kind, link.bandwidth_gbs, link.latency_us)
                      for link in (self.cost.link(a, b) for a, b in pairs))
        return devices, links

    def _plan_group(self, ordered: list[DeviceSpec]) -> tuple[tuple[Placement, ...], int] | None:
        cost, request = self.cost, self.request
        batch, budget, bits = cost.batch, request.quantized_layer_budget, request.sorted_bits
        if self.kl is not None:
            budget = KL_UNITS
        exact = self.exact and len(ordered) <= EXACT_ORDER_LIMIT
        orders = ([ordered] if exact
                  else [self._respect_pins(o) for o in candidate_orders(ordered, request.fleet)])
        options: list[tuple[tuple[Placement, ...], int]] = []
        for order in orders:
            micro_batches, tried = min(batch, len(order)), set()
            while micro_batches not in tried:
                tried.add(micro_batches)
                found = bottleneck_partition(cost, order, micro_batch_size(batch, micro_batches), budget,
                                             bits, self.pins, exact_order=exact, kl=self.kl)
                if found is None:
                    break
                # The partition was sized for this micro-batch; other counts may pace it better
                # (ceil(batch / m) wastes slots when m does not divide the batch). Pricing is cheap.
                options.extend((found.stages, m) for m in range(1, min(batch, 2 * len(found.stages)) + 1))
                micro_batches = min(batch, len(found.stages))
        # One device: the chain is the bottleneck plan. Measured: the same search over KL units' fronts.
        if len(ordered) > 1:
            chain = (sum_partition(cost, orders[0], batch, budget, bits, self.pins) if self.kl is None
                     else sum_partition_kl(cost, orders[0], batch, bits, self.kl, self.pins))
            if chain is not None:
                options.append((chain.stages, 1))
        if request.tensor_parallel:
            options.extend(self._joint(self._respect_pins(ordered), budget, bits))
        if not options:
            return None
        rounds = [round_seconds(cost, *option) for option in options]
        fastest = min(rounds)
        # Within 1% of the fastest round, fewer low-bit layers win (the least KL when measured, and among
        # equal counts the least KL when the model is profiled), then fewer network hops, then the faster,
        # then fewer stages.
        return min((o for o, r in zip(options, rounds) if r * (1.0 - THROUGHPUT_TOLERANCE) <= fastest),
                   key=lambda o: (self._quality(o[0]), network_hops(cost, o[0]), rounds[options.index(o)],
                                  len(o[0])))

    def _joint(self, ordered: list[DeviceSpec], budget: int, bits) -> list[tuple[tuple[Placement, ...], int]]:
        """Plans with tensor-parallel groups (joint.py): the least bottleneck with the pipeline full, and
        the least trip of one micro-batch, each at the micro-batch counts that pace it; within the pins
        (``ordered`` visits pinned devices in the order of their layers)."""
        cost, batch, options = self.cost, self.cost.batch, []
        micro_batches, tried = min(batch, len(ordered)), set()
        while batch > 1 and micro_batches not in tried:
            tried.add(micro_batches)
            found = joint_partition(cost, ordered, micro_batch_size(batch, micro_batches), budget, bits,
                                    "bottleneck", self.pins, self.kl)
            if found is None:
                break
            options.extend((found.stages, m) for m in range(1, min(batch, 2 * len(found.stages)) + 1))
            micro_batches = min(batch, len(found.stages))
        found = joint_partition(cost, ordered, batch, budget, bits, "chain", self.pins, self.kl)
        if found is not None:
            options.append((found.stages, 1))
        return options

    def _respect_pins(self, order: list[DeviceSpec]) -> list[DeviceSpec]:
        """A fixed order must visit pinned devices in the order of their layers: keep the free
        devices where they are and put the pinned ones, sorted by their first layer, in the slots
        the pinned ones occupied (a pin starting at layer 0 goes first, one ending at the last layer
        goes last)."""
        if not self.pins:
            return order
        pinned = sorted((d for d in order if d.name in self.pins), key=lambda d: self.pins[d.name])
        slots = [i for i, d in enumerate(order) if d.name in self.pins]
        if pinned and self.pins[pinned[0].name][0] == 0:
            slots[0] = -1
        if pinned and self.pins[pinned[-1].name][1] == self.cost.num_layers:
            slots[-1] = len(order)
        placed = sorted(list(zip(slots, range(len(pinned)), pinned))
                        + [(i, -1, d) for i, d in enumerate(order) if d.name not in self.pins],
                        key=lambda item: item[:2])
        return [d for _, _, d in placed]
