"""Stored calibration: the window and its median, when a ratio counts and is announced, and what the
planner's fleet gets (a device's own factors per precision, else its peers')."""

from __future__ import annotations

import pytest
from django.test import override_settings

from contracts.fleet_file import parse_fleet
from controlplane.inventory.calibration import (
    Observation,
    calibrations,
    device_calibration_observe,
    window_add,
    window_ratio,
)
from controlplane.inventory.models import Device, DeviceCalibration
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.inventory.services import fleet_import

pytestmark = pytest.mark.django_db
REAL = {"name": "cal", "emulated": False,
        "nodes": [{"name": "a", "gpus": [{"model": "T4", "count": 3}, {"model": "A100-80GB-SXM"}]}]}
EMULATED = {"name": "emu", "nodes": [{"name": "b", "gpus": [{"model": "T4"}]}]}
SETTINGS = {"MOTLEY_CALIBRATION_MIN_SAMPLES": 4, "MOTLEY_CALIBRATION_WINDOW": 10,
            "MOTLEY_CALIBRATION_WINDOW_S": 100.0, "MOTLEY_CALIBRATION_EVENT_CHANGE": 0.1}


def observations(*ratios: float, start: float = 1000.0, stage: str = "d1-r0-s0") -> list[Observation]:
    return [Observation(start + i, r, stage) for i, r in enumerate(ratios)]


@pytest.fixture
def devices() -> dict[str, Device]:
    for fleet in (REAL, EMULATED):
        fleet_import(fleet=parse_fleet(fleet))
    return {d.name: d for d in Device.objects.select_related("node")}


def test_the_window_keeps_the_newest_within_its_age_and_size_once_each():
    window = window_add([], observations(1.0, 2.0, 3.0), now=1002.0, size=10, max_age_s=100)
    assert [e[1] for e in window] == [1.0, 2.0, 3.0]
    again = window_add(window, observations(1.0, 2.0, 3.0), now=1002.0, size=10, max_age_s=100)
    assert again == window  # the same sample read by two passes counts once
    other_stage = window_add(window, observations(5.0, stage="d1-r0-s1"), now=1002.0, size=10, max_age_s=100)
    assert len(other_stage) == 4
    assert [e[1] for e in window_add(window, observations(4.0, start=1003.0), now=1003.0, size=2,
                                     max_age_s=100)] == [3.0, 4.0]
    assert [e[1] for e in window_add(window, [], now=1100.5, size=10, max_age_s=100)] == [2.0, 3.0]


def test_the_median_shrugs_off_outliers():
    window = window_add([], observations(2.0, 2.1, 1.9, 2.0, 50.0, 0.01, 2.05), now=1010, size=10,
                        max_age_s=100)
    assert window_ratio(window) == 2.0
    assert window_ratio([]) is None


@override_settings(**SETTINGS)
def test_a_ratio_counts_from_the_minimum_samples_on_and_is_announced_when_it_moves(devices):
    t4 = devices["a/gpu0"]
    first = device_calibration_observe(device=t4, bits=16, observations=observations(2.0, 2.2, 1.8), now=1003)
    assert first.row.samples == 3 and first.row.ratio == 2.0 and not first.announce
    assert calibrations().for_device(t4).source == "none"  # 3 < 4 samples: not used yet

    counted = device_calibration_observe(device=t4, bits=16, observations=observations(2.1, start=1003.0),
                                         now=1004)
    assert counted.announce and counted.previous is None
    assert counted.row.announced_ratio == pytest.approx(2.05)
    assert calibrations().for_device(t4).at(16) == pytest.approx(2.05)

    small = device_calibration_observe(device=t4, bits=16, observations=observations(2.3, start=1004.0),
                                       now=1005)
    assert not small.announce  # 2.1 against 2.05 announced: within 10 %
    moved = device_calibration_observe(device=t4, bits=16,
                                       observations=observations(*[3.0] * 7, start=1005.0), now=1012)
    assert moved.announce and moved.previous == pytest.approx(2.05) and moved.row.ratio == 3.0
    assert DeviceCalibration.objects.get(device=t4, bits=16).samples == 10


@override_settings(**SETTINGS)
def test_old_observations_leave_the_window(devices):
    t4 = devices["a/gpu0"]
    device_calibration_observe(device=t4, bits=16, observations=observations(2.0, 2.0, 2.0, 2.0), now=1004)
    later = device_calibration_observe(device=t4, bits=16, observations=observations(4.0, start=1150.0),
                                       now=1150)
    assert later.row.samples == 1 and later.row.ratio == 4.0
    assert calibrations().for_device(t4).source == "none"


@override_settings(**SETTINGS)
def test_factors_per_precision_and_from_peers(devices):
    measured, peer = devices["a/gpu0"], devices["a/gpu1"]
    a100, emulated = devices["a/gpu3"], devices["b/gpu0"]
    device_calibration_observe(device=measured, bits=16, observations=observations(*[2.0] * 4), now=1004)
    device_calibration_observe(device=measured, bits=4, now=1004,
                               observations=observations(*[3.0] * 5, stage="d1-r0-s1"))
    device_calibration_observe(device=measured, bits=8, observations=observations(9.0), now=1004)  # too few
    found = calibrations()
    own = found.for_device(measured)
    assert own.source == "measured" and own.by_bits == {16: 2.0, 4: 3.0} and own.samples == {16: 4, 4: 5}
    assert own.factor == 3.0  # the median of all nine counted observations, for precisions not measured
    assert (own.at(16), own.at(8), own.at(4)) == (2.0, 3.0, 3.0)
    # Never measured: the same GPU model's median, else its kind's (emulated or not), else 1.
    assert (found.for_device(peer).source, found.for_device(peer).factor) == ("model", 3.0)
    assert (found.for_device(a100).source, found.for_device(a100).factor) == ("kind", 3.0)
    assert (found.for_device(emulated).source, found.for_device(emulated).factor) == ("none", 1.0)

    fleet = {d.name: d for d in fleet_spec_from_inventory().devices}
    assert fleet["a/gpu0"].calibration == 3.0
    assert fleet["a/gpu0"].calibration_by_bits == ((16, 2.0), (4, 3.0))
    assert fleet["a/gpu0"].calibration_at(16) == 2.0 and fleet["a/gpu0"].calibration_at(8) == 3.0
    assert (fleet["a/gpu1"].calibration, fleet["a/gpu1"].calibration_by_bits) == (3.0, ())
    assert fleet["b/gpu0"].calibration == 1.0


def test_an_uncalibrated_inventory_gives_uncalibrated_devices(devices):
    fleet = fleet_spec_from_inventory()
    assert {(d.calibration, d.calibration_by_bits) for d in fleet.devices} == {(1.0, ())}
