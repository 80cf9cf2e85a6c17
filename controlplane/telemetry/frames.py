"""What a browser socket is sent: a full snapshot, or the delta from the version the browser holds, of
the nodes it shows, rendered once per tick for every socket that wants the same.

Two frames, both JSON text (the socket's protocol: docs/dashboard.md, "Live updates"):

    {"type": "snapshot", "version": V, "at": t, "fleet": {...},
     "devices": {name: sample}, "stages": {key: stats}}
    {"type": "delta", "from": v, "version": V, "at": t, "fleet": {...}, "devices": {...},
     "patches": {name: {field: value}}, "stages": {...}, "removed": {"devices": [...], "stages": [...]}}

A delta carries the GPUs and stages of the shown nodes whose figures changed after version ``v`` and
names the ones that went away (or moved to a node not shown). A GPU comes as a patch of the fields
that changed (its time and utilization, mostly) when the browser holds one of the node's last few
samples, which the hub keeps (``hub.PAST_KEPT``: the one before the latest when a browser acks every
tick and a node reports every second, an older one when the browser runs late); any other comes
whole in ``devices``, as stages always do. Deleting the removed, replacing the entries in ``devices`` and
``stages`` and merging the patches into the state at ``v`` gives the snapshot at ``V`` of the same
nodes. ``fleet`` counts the whole fleet whatever is shown (nodes reporting, GPUs, stages, GPUs
throttled by a slowdown reason).

Why per node: a heartbeat replaces one node's figures, so each node's GPUs (whole and as patches) and
stages are rendered to JSON once per change (``_fragment``) and a frame is a join of the fragments
of the nodes it carries, never a ``json.dumps`` of the fleet; and a frame's text is kept for the
tick by (from-version, nodes shown), so the browsers that hold the same version and show the same
nodes (every Fleet page that acked the last tick) cost one frame between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane.common import json_text

if TYPE_CHECKING:
    from controlplane.telemetry.hub import TelemetryHub

# The most node names one subscription may list; a page showing more subscribes to every node ("*").
SUBSCRIBE_MAX_NODES = 256
SUBSCRIBE_SHAPE = 'expected {"nodes": "*" or a list of node names, "deltas": true or false}'


class SubscriptionError(ValueError):
    """A subscribe message the socket refuses; the text says what is wrong with it."""


@dataclass(frozen=True)
class Subscription:
    """The nodes a page shows (None: every node), and whether it applies deltas (a plain script may
    ask for full snapshots on every tick instead)."""

    nodes: frozenset[str] | None = None
    deltas: bool = True

    @classmethod
    def parse(cls, value: Any) -> Subscription:
        """The subscription a browser sent as ``{"subscribe": value}``, or SubscriptionError."""
        if not isinstance(value, dict):
            raise SubscriptionError(f"subscribe: {SUBSCRIBE_SHAPE}")
        if unknown := sorted(set(value) - {"nodes", "deltas"}):
            fields = ", ".join(map(repr, unknown))
            raise SubscriptionError(f"subscribe: unknown field {fields}; {SUBSCRIBE_SHAPE}")
        deltas = value.get("deltas", True)
        if not isinstance(deltas, bool):
            raise SubscriptionError("subscribe.deltas: expected true or false")
        nodes = value.get("nodes", "*")
        if nodes == "*":
            return cls(None, deltas)
        if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
            raise SubscriptionError('subscribe.nodes: expected "*" or a list of node names '
                                    '(non-empty strings)')
        if len(nodes) > SUBSCRIBE_MAX_NODES:
            raise SubscriptionError(f'subscribe.nodes: {len(nodes)} names, over {SUBSCRIBE_MAX_NODES}; '
                                    f'subscribe to "*" instead')
        return cls(frozenset(nodes), deltas)

    def shows(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes


class Frames:
    """The frames of one hub: node fragments rendered once per change, frames once per tick."""

    def __init__(self, hub: TelemetryHub):
        self.hub = hub
        self._fragments: dict[str, _Fragment] = {}
        self._tick: dict[tuple[int | None, frozenset[str] | None], tuple[int, str]] = {}
        self.renders = 0  # frames rendered, not taken from the tick's

    def new_tick(self) -> None:
        self._tick.clear()

    def frame(self, subscription: Subscription, held: int | None) -> tuple[int, str]:
        """``(version, text)`` for a browser holding version ``held`` (None: nothing) of the
        subscription's nodes, shared by every socket asking the same during this tick."""
        hub = self.hub
        since = held if subscription.deltas and held is not None and held >= hub.forgotten else None
        key = (since, subscription.nodes)
        if (frame := self._tick.get(key)) is None:
            frame = self._tick[key] = self.render(subscription, since)
        return frame

    def render(self, subscription: Subscription, since: int | None) -> tuple[int, str]:
        """A snapshot of the subscription's nodes (``since`` None), else the delta after ``since``."""
        hub = self.hub
        self.renders += 1
        names = hub.nodes if subscription.nodes is None else [n for n in subscription.nodes if n in hub.nodes]
        if since is not None:
            names = [n for n in names if hub.nodes[n].version > since]
        devices, patches, stages = [], [], []
        for node in names:
            fragment = self._fragment(node)
            if since is not None and (held := hub.nodes[node].held_at(since)) is not None:
                new, changed = fragment.patched(held)
                devices.append(new)
                patches.append(changed)
            else:
                devices.append(fragment.devices)
            stages.append(fragment.stages)
        fleet = {"nodes": len(hub.nodes), "gpus": len(hub.devices), "stages": len(hub.stages),
                 "throttled": sum(n.throttled for n in hub.nodes.values())}
        head = (f'{{"type":"snapshot","version":{hub.version}' if since is None
                else f'{{"type":"delta","from":{since},"version":{hub.version}')
        text = (f'{head},"at":{json_text.dumps(hub.clock())},"fleet":{json_text.dumps(fleet)},'
                f'"devices":{{{_join(devices)}}},"stages":{{{_join(stages)}}}')
        if since is not None:
            removed = json_text.dumps(self._removed(subscription, since))
            text += f',"patches":{{{_join(patches)}}},"removed":{removed}'
        return hub.version, text + "}"

    def _fragment(self, node: str) -> _Fragment:
        """The node's fragments at its current version (each form rendered when first asked for)."""
        state = self.hub.nodes[node]
        cached = self._fragments.get(node)
        if cached is None or cached.version != state.version:
            cached = self._fragments[node] = _Fragment(self.hub, state)
        return cached

    def _removed(self, subscription: Subscription, since: int) -> dict[str, list[str]]:
        """GPUs and stages of the shown nodes gone after ``since`` and not (again) shown now."""
        hub = self.hub
        removed: dict[str, set[str]] = {"devices": set(), "stages": set()}
        for version, _, node, kind, key in reversed(hub.tombstones):
            if version <= since:
                break
            if not subscription.shows(node):
                continue
            now = hub.devices.get(key) if kind == "devices" else hub.stages.get(key)
            if now is None or not subscription.shows(now["node"]):
                removed[kind].add(key)
        return {kind: sorted(keys) for kind, keys in removed.items()}


class _Fragment:
    """One node's JSON object members at one version: every GPU whole (for a snapshot); as a delta from
    one of its earlier samples, the GPUs new or reshaped whole and the others' changed fields; its
    stages. Each is rendered the first time a frame needs it, once per version of the node (and per
    earlier sample patched against)."""

    def __init__(self, hub: TelemetryHub, state):
        self.hub, self.state, self.version = hub, state, state.version
        self._devices: str | None = None
        self._deltas: dict[int, tuple[str, str]] = {}  # by the earlier version patched against
        self._stages: str | None = None

    @property
    def devices(self) -> str:
        if self._devices is None:
            devices = self.hub.devices
            self._devices = json_text.dumps({name: devices[name] for name in self.state.devices})[1:-1]
        return self._devices

    @property
    def stages(self) -> str:
        if self._stages is None:
            stages = self.hub.stages
            self._stages = json_text.dumps({key: stages[key] for key in sorted(self.state.stages)})[1:-1]
        return self._stages

    def patched(self, held: tuple[int, dict[str, dict[str, Any]]]) -> tuple[str, str]:
        """The GPUs new or reshaped since ``held`` (an earlier version of the node and its entries,
        from ``NodeState.held_at``), whole, and the others' changed fields."""
        version, earlier = held
        if (delta := self._deltas.get(version)) is None:
            new, patches = {}, {}
            for name in self.state.devices:
                entry, before = self.hub.devices[name], earlier.get(name)
                if before is None or before.keys() != entry.keys():
                    new[name] = entry
                elif changed := {f: v for f, v in entry.items() if before[f] != v}:
                    patches[name] = changed
            delta = self._deltas[version] = (json_text.dumps(new)[1:-1], json_text.dumps(patches)[1:-1])
        return delta


def _join(fragments: list[str]) -> str:
    return ",".join(f for f in fragments if f)
