"""The frames a browser socket is sent (controlplane/telemetry/frames.py): a delta applied to the
snapshot a browser holds gives the snapshot at the delta's version, for random fleets changing at
random (GPUs changing, appearing and going away, stages moving between nodes and ending), checked
against a model of what the heartbeats said; a subscription shows only its nodes; frames are shared
within a tick; a bad subscription is refused saying why."""

from __future__ import annotations

import json
import random

import pytest

from controlplane.telemetry.frames import SUBSCRIBE_MAX_NODES, Subscription, SubscriptionError
from controlplane.telemetry.hub import TelemetryHub
from controlplane.telemetry.services import telemetry_message, telemetry_sample
from tests.dashboard.test_hub import Clock, _gpu


def _heartbeat(node: str, t: float, gpus: dict[int, float], stages: list[str]) -> dict:
    heartbeat = {"type": "heartbeat", "incarnation": 1, "seq": 1, "sent_at": t - 0.01,
                 "devices": [_gpu(util, index=i) for i, util in gpus.items()],
                 "stages": [{"stage_key": k, "deployment_id": 1, "replica": 0, "stage_index": 0,
                             "state": "ready", "stats": {"step_ms": t % 7}} for k in stages]}
    return telemetry_message(telemetry_sample(node_id=1, node_name=node, heartbeat=heartbeat, received_at=t))


def apply(delta: dict, state: dict) -> dict:
    """What the dashboard's live.js does with a delta: drop the removed, replace the entries sent
    whole, merge the patches."""
    assert delta["type"] == "delta" and delta["from"] == state["version"]
    devices = {k: v for k, v in state["devices"].items() if k not in delta["removed"]["devices"]}
    stages = {k: v for k, v in state["stages"].items() if k not in delta["removed"]["stages"]}
    devices |= delta["devices"]
    for name, fields in delta["patches"].items():
        devices[name] = {**devices[name], **fields}
    return {**state, "version": delta["version"], "at": delta["at"], "fleet": delta["fleet"],
            "devices": devices, "stages": stages | delta["stages"]}


class Fleet:
    """Random heartbeats, and what they said: each node's GPUs, and which node reports each stage last."""

    def __init__(self, rng: random.Random, nodes: int):
        self.rng, self.t = rng, 1000.0
        self.gpus = {f"n{i}": {g: 0.0 for g in range(rng.randint(0, 3))} for i in range(nodes)}
        self.stages: dict[str, set[str]] = {n: set() for n in self.gpus}
        self.reported: set[str] = set()

    def step(self) -> dict:
        rng, node = self.rng, self.rng.choice(sorted(self.gpus))
        self.t += 0.1
        gpus, stages = self.gpus[node], self.stages[node]
        action = rng.random()
        if action < 0.15 and gpus:
            del gpus[rng.choice(sorted(gpus))]
        elif action < 0.3:
            gpus[rng.randint(0, 4)] = 0.0
        elif action < 0.45:
            key = f"s{rng.randint(0, 6)}"  # a new stage, or one that moves here from another node
            for others in self.stages.values():
                others.discard(key)
            stages.add(key)
        elif action < 0.55 and stages:
            stages.discard(rng.choice(sorted(stages)))
        for g in gpus:
            gpus[g] = round(rng.uniform(0, 100), 2)
        self.reported.add(node)
        return _heartbeat(node, self.t, dict(gpus), sorted(stages))

    def expected(self, subscription: Subscription) -> tuple[set[str], set[str]]:
        """The GPUs and stages the snapshot of these nodes must hold, by the heartbeats' own account."""
        shown = [n for n in self.reported if subscription.shows(n)]
        return ({f"{n}/gpu{g}" for n in shown for g in self.gpus[n]},
                {k for n in shown for k in self.stages[n]})


def _random_hub(seed: int, nodes: int) -> tuple[random.Random, TelemetryHub, Fleet]:
    rng = random.Random(seed)
    return rng, TelemetryHub(clock=Clock(1000.0)), Fleet(rng, nodes=nodes)


def _next_tick(hub: TelemetryHub, fleet: Fleet, heartbeats: int) -> None:
    """``heartbeats`` of the fleet's, then a new tick (frames are rendered afresh)."""
    for _ in range(heartbeats):
        hub.ingest(fleet.step())
        hub.clock.t = fleet.t
    hub.frames.new_tick()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("nodes", [None, ("n0", "n2", "n-never-seen")])
def test_a_delta_applied_to_the_old_snapshot_is_the_new_snapshot(seed, nodes):
    rng, hub, fleet = _random_hub(seed, 5)
    subscription = Subscription(None if nodes is None else frozenset(nodes))
    held = json.loads(hub.frames.render(subscription, None)[1])
    patched = 0
    for _ in range(60):
        _next_tick(hub, fleet, rng.randint(0, 8))
        version, text = hub.frames.frame(subscription, held["version"])
        delta = json.loads(text)
        assert version == delta["version"] == hub.version
        snapshot = json.loads(hub.frames.render(subscription, None)[1])
        assert apply(delta, held) == snapshot
        patched += bool(delta["patches"])
        assert (set(snapshot["devices"]), set(snapshot["stages"])) == fleet.expected(subscription)
        for name, sample in snapshot["devices"].items():  # the latest heartbeat's figures
            assert sample["utilization_pct"] == fleet.gpus[sample["node"]][int(name.rsplit("gpu", 1)[1])]
        held = snapshot if rng.random() < 0.2 else apply(delta, held)  # sometimes a full snapshot
    assert patched  # GPUs came as patches of their previous sample too


@pytest.mark.parametrize("seed", range(4))
def test_a_browser_several_versions_behind_gets_patches_that_make_the_new_snapshot(seed):
    """A late browser (a busy server, a slow page) holds a version from a few ticks back: the delta
    from it still applies to give the new snapshot, and a node that changed several times since is
    patched against the sample the browser holds (hub.PAST_KEPT), not sent whole."""
    rng, hub, fleet = _random_hub(seed, 3)
    states = [json.loads(hub.frames.render(Subscription(), None)[1])]
    patched_late = 0
    for _ in range(40):
        _next_tick(hub, fleet, rng.randint(1, 4))
        held = rng.choice(states[-4:])
        delta = json.loads(hub.frames.frame(Subscription(), held["version"])[1])
        snapshot = json.loads(hub.frames.render(Subscription(), None)[1])
        assert apply(delta, held) == snapshot
        before = states[-1]["devices"]  # the previous tick's
        patched_late += sum(held["devices"][name]["t"] < before.get(name, {}).get("t", 0) < sample["t"]
                            for name, sample in snapshot["devices"].items() if name in delta["patches"])
        states.append(snapshot)
    assert patched_late  # GPUs that changed twice since the browser's version, and came as patches


def test_only_the_nodes_shown_are_sent_with_the_whole_fleet_counted():
    hub = TelemetryHub(clock=Clock(1000.0))
    hub.ingest(_heartbeat("a", 1000.0, {0: 10.0, 1: 20.0}, ["d1-r0-s0"]))
    hub.ingest(_heartbeat("b", 1000.0, {0: 30.0}, ["d1-r0-s1"]))
    frame = json.loads(hub.frames.render(Subscription(frozenset({"b"})), None)[1])
    assert set(frame["devices"]) == {"b/gpu0"} and set(frame["stages"]) == {"d1-r0-s1"}
    assert frame["fleet"] == {"nodes": 2, "gpus": 3, "stages": 2, "throttled": 0}
    held = frame["version"]
    hub.ingest(_heartbeat("a", 1001.0, {0: 50.0}, []))  # a node not shown changes: nothing for b's page
    delta = json.loads(hub.frames.frame(Subscription(frozenset({"b"})), held)[1])
    assert delta["devices"] == {} and delta["removed"] == {"devices": [], "stages": []}
    assert delta["fleet"]["gpus"] == 2
    hub.ingest(_heartbeat("a", 1002.0, {0: 50.0}, ["d1-r0-s1"]))  # b's stage moved to a: gone from b's page
    hub.frames.new_tick()
    delta = json.loads(hub.frames.frame(Subscription(frozenset({"b"})), held)[1])
    assert delta["removed"] == {"devices": [], "stages": ["d1-r0-s1"]} and delta["stages"] == {}


def test_a_frame_is_rendered_once_per_tick_for_every_socket_asking_the_same():
    hub = TelemetryHub(clock=Clock(1000.0))
    hub.ingest(_heartbeat("a", 1000.0, {0: 10.0}, []))
    everything = Subscription()
    first = hub.frames.frame(everything, None)
    hub.ingest(_heartbeat("a", 1000.5, {0: 20.0}, []))  # within the tick: the tick's frame stands
    assert hub.frames.frame(Subscription(), None) is first and hub.frames.renders == 1
    assert hub.frames.frame(everything, first[0]) is not first  # another version held: another frame
    hub.frames.new_tick()
    version, text = hub.frames.frame(everything, None)
    assert version == hub.version and json.loads(text)["devices"]["a/gpu0"]["utilization_pct"] == 20.0


def test_a_browser_older_than_the_tombstones_remembered_or_wanting_no_deltas_gets_a_snapshot():
    clock = Clock(1000.0)
    hub = TelemetryHub(clock=clock)
    hub.ingest(_heartbeat("a", 1000.0, {0: 10.0, 1: 5.0}, []))
    held = hub.version
    assert json.loads(hub.frames.frame(Subscription(deltas=False), held)[1])["type"] == "snapshot"
    hub.ingest(_heartbeat("a", 1001.0, {0: 10.0}, []))  # gpu1 went away: a tombstone
    clock.t = 1100.0
    hub.ingest(_heartbeat("a", 1100.0, {0: 10.0}, []))  # ... forgotten a minute later
    hub.frames.new_tick()
    frame = json.loads(hub.frames.frame(Subscription(), held)[1])
    assert frame["type"] == "snapshot" and set(frame["devices"]) == {"a/gpu0"}


def test_a_subscription_takes_node_names_or_every_node():
    assert Subscription.parse({"nodes": "*"}) == Subscription()
    assert Subscription.parse({}) == Subscription()
    parsed = Subscription.parse({"nodes": ["a", "b", "a"], "deltas": False})
    assert parsed == Subscription(frozenset("ab"), False)


@pytest.mark.parametrize(("value", "says"), [
    (["a"], "expected {"),
    ({"nodes": "a"}, 'expected "*" or a list of node names'),
    ({"nodes": ["a", 3]}, "non-empty strings"),
    ({"nodes": [""]}, "non-empty strings"),
    ({"nodes": [f"n{i}" for i in range(SUBSCRIBE_MAX_NODES + 1)]}, f"over {SUBSCRIBE_MAX_NODES}"),
    ({"nodes": "*", "deltas": "yes"}, "subscribe.deltas: expected true or false"),
    ({"nodes": "*", "groups": ["r0"]}, "unknown field 'groups'"),
])
def test_a_bad_subscription_is_refused_saying_what_is_wrong(value, says):
    with pytest.raises(SubscriptionError) as refused:
        Subscription.parse(value)
    assert says in str(refused.value)
