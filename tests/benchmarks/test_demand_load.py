"""The pure parts of benchmarks/demand_bench.py: the day's load curve, the arrival schedule that follows
it, and the arithmetic of the figures (share within targets, card-seconds)."""

from __future__ import annotations

import pytest

from benchmarks import demand_load as day
from benchmarks.demand_bench import fleet_text, policy_env, sizes
from contracts.fleet_file import load_fleet_file


def test_the_day_rises_from_low_to_high_and_back_out_of_phase():
    day_s = 600.0
    a = [day.multiplier(t, day_s=day_s, phase=0.0) for t in (0, 150, 300, 450, 600)]
    assert a == pytest.approx([0.2, 1.6, 3.0, 1.6, 0.2])
    b = [day.multiplier(t, day_s=day_s, phase=0.5) for t in (0, 300)]
    assert b == pytest.approx([3.0, 0.2])  # the other model peaks when the first is lowest
    samples = [day.multiplier(t, day_s=day_s, phase=0.0) for t in range(600)]
    assert sum(samples) / len(samples) == pytest.approx(day.mean_multiplier(), rel=1e-3)
    with pytest.raises(ValueError, match="day_s"):
        day.multiplier(1, day_s=0, phase=0)


def test_arrivals_follow_the_rate_without_noise():
    steady = day.arrivals(lambda t: 2.0, start=0.0, end=10.0)
    assert len(steady) == 20
    gaps = [b - a for a, b in zip(steady, steady[1:])]
    assert max(gaps) - min(gaps) < 0.02  # evenly spaced: the offered load, not a Poisson draw
    rising = day.arrivals(lambda t: day.multiplier(t, day_s=100, phase=0.0), start=0.0, end=100.0)
    assert len(rising) == pytest.approx(160, abs=1)  # the integral of the curve: 1.6 x 100 s
    assert sum(t < 25 for t in rising) < sum(25 <= t < 50 for t in rising)  # rising toward the peak


def test_a_request_is_within_its_targets_on_both_ttft_and_tpot():
    targets = {"m": day.Targets(ttft_ms=500, tpot_ms=100)}
    fast = day.Request("m", started=0.0, first_token=0.4, ended=1.3, ok=True, tokens=10)  # 100 ms a token
    slow_start = day.Request("m", started=0.0, first_token=0.6, ended=1.0, ok=True, tokens=10)
    slow_tokens = day.Request("m", started=0.0, first_token=0.1, ended=2.0, ok=True, tokens=10)
    one_token = day.Request("m", started=0.0, first_token=0.2, ended=5.0, ok=True, tokens=1)
    failed = day.Request("m", started=0.0, ended=0.1, error="APIStatusError")
    assert [r.within(targets["m"]) for r in (fast, slow_start, slow_tokens, one_token, failed)] == [
        True, False, False, True, False]
    assert day.attainment([fast, slow_start, one_token, failed], targets) == 0.5
    assert day.attainment([], targets) is None


def test_card_seconds_hold_each_count_until_the_next_sample():
    samples = [(10.0, 2), (20.0, 4), (25.0, 1)]
    assert day.card_seconds(samples, 10.0, 30.0) == 2 * 10 + 4 * 5 + 1 * 5
    assert day.card_seconds(samples, 15.0, 22.0) == 2 * 5 + 4 * 2  # the count before the window holds into it
    assert day.card_seconds(samples, 0.0, 12.0) == 2 * 12  # before the first sample: its count
    assert day.card_seconds([], 0.0, 5.0) == 0.0


def test_the_fleet_file_parses_and_the_policy_clocks_scale_with_the_day(tmp_path):
    path = tmp_path / "fleet.yaml"
    path.write_text(fleet_text(3, "{memory_bandwidth_gbs: 0.01, fp16_tflops: 0.002}", hop_ms=400))
    fleet = load_fleet_file(path)
    assert [d.memory_bandwidth_gbs for d in fleet.devices] == [0.01] * 3
    assert len(fleet.links) == 3 and {link.latency_us for link in fleet.links} == {400_000}
    assert policy_env(600)["MOTLEY_REBALANCE_DRIFT_FOR_S"] == "10"
    assert policy_env(600)["MOTLEY_REBALANCE_COOLDOWN_S"] == "20"
    assert policy_env(60)["MOTLEY_REBALANCE_COOLDOWN_S"] == "8"


def test_each_way_starts_its_day_at_its_size():
    assert sizes("auto", 600) == {"day-a": 1, "day-b": 4}  # day-b's day starts at its peak, at the mark
    assert sizes("mean", 600) == {"day-a": 2, "day-b": 2}
    assert sizes("peak", 600) == {"day-a": 4, "day-b": 4}  # 3x at the 80 % high mark
