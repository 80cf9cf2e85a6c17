"""Live signals (pure): a replica's health from its stages' and devices' telemetry, measured costs,
and the router moving traffic away from a throttled or stale replica and back."""

from __future__ import annotations

import pytest

from controlplane.gateway.routing import (
    Decision,
    DeviceSample,
    MeasuredCosts,
    Rejection,
    ReplicaCosts,
    ReplicaState,
    RequestShape,
    Router,
    StageLink,
    StageSample,
    replica_reading,
)

COSTS = ReplicaCosts(prefill_s_per_token=0.0005, decode_s_per_token=0.0, decode_step_s=0.02)
LINKS = (StageLink("d1-r0-s0", "n0/gpu0"), StageLink("d1-r0-s1", "n1/gpu0"))
GB = 1 << 30


def device(name: str, *, age: float = 0.5, clock: float = 1590, reasons: tuple[str, ...] = (),
           used: int = 4 * GB) -> DeviceSample:
    return DeviceSample(name, age, used, 16 * GB, clock, 1590, reasons)


def stage(key: str, *, age: float = 0.5, step_ms: float = 10.0, batch: float = 2.0, state: str = "ready"):
    return StageSample(key, age, state, step_ms, batch, 0, 1000)


def reading(*changed: DeviceSample | StageSample, missing: tuple[str, ...] = (), stale_s: float = 3.0):
    """A healthy two-stage replica's reading with some samples ``changed`` and some ``missing``."""
    devices = {"n0/gpu0": device("n0/gpu0"), "n1/gpu0": device("n1/gpu0")}
    stages = {"d1-r0-s0": stage("d1-r0-s0"), "d1-r0-s1": stage("d1-r0-s1")}
    for sample in changed:
        if isinstance(sample, DeviceSample):
            devices[sample.name] = sample
        else:
            stages[sample.stage_key] = sample
    for name in missing:
        devices.pop(name, None)
        stages.pop(name, None)
    return replica_reading(LINKS, devices, stages, stale_s=stale_s)


def test_a_fresh_healthy_replica_is_ok_with_its_measured_step_time():
    r = reading()
    assert r.health.ok and r.health.reason == ""
    assert (r.health.throttle, r.health.memory_pressure) == (0.0, 0.25)
    assert r.step_s == pytest.approx(0.020) and r.batch == 2.0 and r.age_s == 0.5
    assert [d["device"] for d in r.devices] == ["n0/gpu0", "n1/gpu0"]


def test_a_throttled_device_counts_by_its_clock_and_its_stage_share_of_a_token():
    r = reading(device("n1/gpu0", clock=795, reasons=("hw_thermal",)))
    # Stage 1 at half clock, both stages 10 ms: a token takes 10 + 20 = 30 ms instead of 20: 1/3 lost.
    assert r.health.ok and r.health.throttle == pytest.approx(1 / 3, abs=1e-3)
    assert r.health.slowdown == pytest.approx(1.5, abs=1e-3)
    (row,) = [d for d in r.devices if d["device"] == "n1/gpu0"]
    assert row["throttle"] == 0.5 and row["throttle_reasons"] == ["hw_thermal"]
    # A lower clock with no throttle reason is an idle card, not a throttled one.
    assert reading(device("n1/gpu0", clock=300)).health.throttle == 0.0
    # A reason without clocks to size it: assumed half speed.
    blind = DeviceSample("n1/gpu0", 0.5, 0, 0, None, None, ("power_cap",))
    assert blind.throttle == 0.5


def test_a_single_stage_replica_takes_its_device_throttle_as_is():
    links = (StageLink("d1-r0-s0", "n0/gpu0"),)
    r = replica_reading(links, {"n0/gpu0": device("n0/gpu0", clock=795, reasons=("sw_thermal",))},
                        {"d1-r0-s0": stage("d1-r0-s0")}, stale_s=3)
    assert r.health.throttle == pytest.approx(0.5) and r.health.slowdown == pytest.approx(2.0)


def test_memory_pressure_is_the_fullest_device():
    r = reading(device("n0/gpu0", used=int(15.9 * GB)))
    assert r.health.memory_pressure == pytest.approx(15.9 / 16, abs=1e-3)
    assert r.health.slowdown > 1.5


@pytest.mark.parametrize(
    ("changed", "missing", "reason"),
    [
        (device("n1/gpu0", age=7.0), (), "device n1/gpu0: telemetry 7.0 s old (limit 3 s)"),
        (stage("d1-r0-s0", age=4.0), (), "stage d1-r0-s0: telemetry 4.0 s old"),
        (None, ("d1-r0-s1",), "stage d1-r0-s1: no telemetry from its agent"),
        (None, ("n0/gpu0",), "device n0/gpu0: no telemetry from its agent"),
        (stage("d1-r0-s1", state="starting"), (), "stage d1-r0-s1 is starting"),
    ],
    ids=["stale-device", "stale-stage", "missing-stage", "missing-device", "not-ready"],
)
def test_stale_or_missing_telemetry_is_unhealthy_not_healthy(changed, missing, reason):
    r = reading(*([changed] if changed else []), missing=missing)
    assert not r.health.ok
    assert reason in r.health.reason
    assert r.step_s is None  # nothing measured from a replica that is not fully reporting


def test_fresh_again_is_ok_again():
    assert not reading(device("n1/gpu0", age=7.0)).health.ok
    assert reading(device("n1/gpu0", age=0.2)).health.ok


def test_an_idle_stage_measures_nothing():
    r = reading(StageSample("d1-r0-s1", 0.5, "ready", 0.0, 0.0))
    assert r.health.ok and r.step_s is None


def test_measured_costs_replace_the_plan_once_enough_samples_exist_and_exclude_throttling():
    measured = MeasuredCosts(min_samples=3)
    slow = reading(stage("d1-r0-s0", step_ms=30.0), stage("d1-r0-s1", step_ms=30.0))
    for at in (100.0, 101.0):
        measured.add("r0", COSTS, at=at, reading=slow)
    assert measured.costs("r0", COSTS, now=102.0) == (COSTS, None)  # two samples: still the plan's
    measured.add("r0", COSTS, at=101.01, reading=slow)  # the same sample read again: not counted
    measured.add("r0", COSTS, at=102.0, reading=slow)
    costs, factor = measured.costs("r0", COSTS, now=102.0)
    assert factor == pytest.approx(3.0) and costs.decode_step_s == pytest.approx(0.06)
    assert costs.prefill_s_per_token == pytest.approx(0.0015)
    # Measured while throttled to half clock: the step is brought back to an unthrottled replica.
    throttled = replica_reading(
        LINKS[:1], {"n0/gpu0": device("n0/gpu0", clock=795, reasons=("hw_thermal",))},
        {"d1-r0-s0": stage("d1-r0-s0", step_ms=40.0)}, stale_s=3,
    )
    other = MeasuredCosts(min_samples=1)
    other.add("r1", COSTS, at=1.0, reading=throttled)
    assert other.factor("r1", now=1.0)[0] == pytest.approx(1.0)  # 40 ms at half clock = 20 ms planned
    # Old samples and a new plan do not count.
    assert measured.costs("r0", COSTS, now=102.0 + 3600)[1] is None
    assert measured.costs("r0", COSTS.scaled(2), now=102.0)[1] is None


def two_replicas() -> tuple[ReplicaState, ReplicaState]:
    return ReplicaState("r0", COSTS, 10_000), ReplicaState("r1", COSTS, 10_000)


def route_many(router: Router, n: int = 20) -> dict[str, int]:
    """Route ``n`` requests that stay in flight (so load spreads them) and count them per replica."""
    counts = {r.replica_id: 0 for r in router.replicas}
    for i in range(n):
        decision = router.route(RequestShape(50, 100), deadline_s=60)
        assert isinstance(decision, Decision)
        decision.replica.start(f"q{i}", RequestShape(50, 100))
        counts[decision.replica.replica_id] += 1
    for r in router.replicas:
        for i in range(n):
            r.finish(f"q{i}")
    return counts


def test_the_cost_aware_router_moves_traffic_off_a_throttled_replica_and_back():
    a, b = two_replicas()
    a.costs = b.costs = ReplicaCosts(0.0005, 0.001, 0.02)  # each running sequence adds: load spreads
    router = Router([a, b])
    single = (StageLink("d1-r0-s0", "n0/gpu0"),)
    stages = {"d1-r0-s0": stage("d1-r0-s0")}

    def observe(clock: float, reasons: tuple[str, ...]) -> None:
        devices = {"n0/gpu0": device("n0/gpu0", clock=clock, reasons=reasons)}
        a.observe(health=replica_reading(single, devices, stages, stale_s=3).health)

    before = route_many(router)
    assert abs(before["r0"] - before["r1"]) <= 2
    observe(795, ("hw_thermal",))
    throttled = route_many(router)
    assert throttled["r0"] < throttled["r1"] / 2
    decision = router.route(RequestShape(50, 100), deadline_s=60)
    (seen,) = [i for i in decision.inputs if i.replica == "r0"]
    assert seen.throttle == pytest.approx(0.5) and seen.slowdown == pytest.approx(2.0) and seen.healthy
    observe(1590, ())
    after = route_many(router)
    assert abs(after["r0"] - after["r1"]) <= 2


def test_a_stale_replica_is_never_chosen_and_all_stale_is_a_503_that_says_so():
    a, b = two_replicas()
    router = Router([a, b])
    single = (StageLink("d1-r0-s0", "n0/gpu0"),)
    stale = replica_reading(single, {"n0/gpu0": device("n0/gpu0", age=9)},
                            {"d1-r0-s0": stage("d1-r0-s0", age=9)},
                            stale_s=3)
    a.observe(health=stale.health)
    assert route_many(router)["r0"] == 0
    decision = router.route(RequestShape(5, 5), deadline_s=60)
    (seen,) = [i for i in decision.inputs if i.replica == "r0"]
    assert not seen.healthy and not seen.candidate and "9.0 s old" in seen.reason
    b.observe(health=stale.health)
    refused = router.route(RequestShape(5, 5), deadline_s=60)
    assert isinstance(refused, Rejection) and refused.status == 503
    assert "r0: " in refused.message and "telemetry 9.0 s old (limit 3 s)" in refused.message
    assert [i.healthy for i in refused.inputs] == [False, False]
