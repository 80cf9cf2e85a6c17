"""The router benchmark's throttle scenario, short: the telemetry-fed router moves traffic off the
throttled replica while it is throttled and back after, where the blind router does not."""

from __future__ import annotations

import pytest

from benchmarks.router_bench import run_throttle, throttle_table


@pytest.fixture(scope="module")
def results():
    return run_throttle(duration=160.0, seed=0, tails=("chat",), loads=(0.5, 0.7))


def test_the_telemetry_fed_router_leaves_the_throttled_replica_and_comes_back(results):
    for tail in results["tails"].values():
        for runs in tail["loads"].values():
            live, blind = runs["telemetry-fed"]["throttled_share"], runs["blind"]["throttled_share"]
            assert live["during"] < 0.7 * live["before"] and live["after"] > 1.3 * live["during"]
            assert live["during"] < 0.75 * blind["during"]
            assert runs["round-robin"]["throttled_share"]["during"] == pytest.approx(1 / 3, abs=0.02)


def test_the_table_names_every_router(results):
    text = throttle_table(results)
    assert text.count("| telemetry-fed |") == text.count("| blind |") == text.count("| round-robin |") == 2
