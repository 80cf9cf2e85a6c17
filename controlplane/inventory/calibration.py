"""Stored calibration: per device and precision, measured over predicted decode step time.

The fit (controlplane/telemetry/calibration.py) turns each fresh stage sample into one observation,
``measured decode ms / the planner's raw prediction at the same batch and context``, and hands them
here per (device, precision). ``device_calibration_observe`` keeps the newest of them in the row's
window (at most ``MOTLEY_CALIBRATION_WINDOW`` observations, none older than
``MOTLEY_CALIBRATION_WINDOW_S``) and their median as the ratio: one stray sample moves nothing.

``calibrations`` is what the planner gets (through ``selectors.fleet_spec_from_inventory``):
a row counts once its window holds ``MOTLEY_CALIBRATION_MIN_SAMPLES`` observations. A device's
factor at a precision is its own row's ratio; at a precision it was not measured at, the median of
all its counted observations; a device never measured takes the median factor of the measured
devices of its GPU model, else of its kind (emulated or not), else 1: it is assumed as far off as
its peers, so a fleet measured in part keeps the relative speeds its catalog figures say.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction

from controlplane.inventory.models import Device, DeviceCalibration

SOURCES = ("measured", "model", "kind", "none")  # where a device's factor comes from, best first


@dataclass(frozen=True)
class Observation:
    """One stage sample's verdict: measured / predicted decode step time, when and from which stage."""

    at: float  # when the control plane received the sample (seconds since the epoch)
    ratio: float
    stage_key: str


@dataclass(frozen=True)
class Factors:
    """A device's calibration as the planner uses it (``DeviceSpec.calibration``, ``calibration_by_bits``)."""

    factor: float = 1.0
    by_bits: dict[int, float] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)  # counted observations per precision
    source: str = "none"  # one of SOURCES

    def at(self, bits: int) -> float:
        return self.by_bits.get(bits, self.factor)


def window_add(window: Sequence[Sequence], observations: Iterable[Observation], *, now: float, size: int,
               max_age_s: float) -> list[list]:
    """``window`` ([at, ratio, stage key] oldest first) with ``observations`` added (one already there,
    same time and stage, is not added twice), none older than ``max_age_s``, at most ``size``."""
    kept = [list(entry) for entry in window]
    seen = {(entry[0], entry[2]) for entry in kept}
    for o in sorted(observations, key=lambda o: o.at):
        if (o.at, o.stage_key) not in seen:
            kept.append([o.at, o.ratio, o.stage_key])
            seen.add((o.at, o.stage_key))
    kept.sort(key=lambda entry: entry[0])
    kept = [entry for entry in kept if entry[0] >= now - max_age_s]
    return kept[-size:] if size > 0 else []


def window_ratio(window: Sequence[Sequence]) -> float | None:
    """The median ratio of a window (None when empty)."""
    return statistics.median(entry[1] for entry in window) if window else None


def counts(samples: int) -> bool:
    """Whether a window of ``samples`` observations is enough for the planner to use its ratio."""
    return samples >= settings.MOTLEY_CALIBRATION_MIN_SAMPLES


@dataclass(frozen=True)
class Observed:
    row: DeviceCalibration
    announce: bool  # counted, and first counted or moved by more than MOTLEY_CALIBRATION_EVENT_CHANGE
    previous: float | None  # the ratio announced before


def device_calibration_observe(*, device: Device, bits: int, observations: Iterable[Observation],
                               now: float) -> Observed:
    """Add observations of ``device`` at ``bits`` to its window; its ratio becomes the window's median.

    ``announce`` says the caller should record an event (the ratio counts for the first time, or
    moved by more than ``MOTLEY_CALIBRATION_EVENT_CHANGE`` since the last one announced).
    """
    with transaction.atomic():
        locked = DeviceCalibration.objects.select_for_update(no_key=True)
        row = locked.filter(device=device, bits=bits).first()
        window = window_add(row.window if row else [], observations, now=now,
                            size=settings.MOTLEY_CALIBRATION_WINDOW,
                            max_age_s=settings.MOTLEY_CALIBRATION_WINDOW_S)
        ratio = window_ratio(window)
        if ratio is None:
            if row is not None:
                row.delete()
            return Observed(DeviceCalibration(device=device, bits=bits, ratio=1.0, samples=0), False, None)
        row = row or DeviceCalibration(device=device, bits=bits)
        previous = row.announced_ratio
        row.window, row.ratio, row.samples = window, ratio, len(window)
        announce = counts(row.samples) and (
            previous is None or abs(ratio / previous - 1.0) > settings.MOTLEY_CALIBRATION_EVENT_CHANGE)
        if announce:
            row.announced_ratio = ratio
        row.save()
    return Observed(row, announce, previous)


@dataclass(frozen=True)
class Calibrations:
    """The stored calibration as the planner uses it: ``for_device`` answers for any device."""

    measured: dict[int, Factors]  # by device id: devices with a counted window
    peers: dict[tuple, float]  # ("model", model name, emulated) / ("kind", emulated) -> median factor

    def for_device(self, device: Device) -> Factors:
        if device.pk in self.measured:
            return self.measured[device.pk]
        for key in (("model", device.model_name, device.emulated), ("kind", device.emulated)):
            if key in self.peers:
                return Factors(self.peers[key], source=key[0])
        return Factors()


def calibrations() -> Calibrations:
    """Every counted calibration, and its peers' medians for devices never measured (one query)."""
    rows = DeviceCalibration.objects.select_related("device").only(
        "device_id", "bits", "ratio", "samples", "window", "device__model_name", "device__emulated")
    measured: dict[int, tuple[list[float], dict, dict, Device]] = {}
    for row in rows:
        if not counts(row.samples):
            continue
        ratios, by_bits, samples, _ = measured.setdefault(row.device_id, ([], {}, {}, row.device))
        ratios.extend(entry[1] for entry in row.window)
        by_bits[row.bits], samples[row.bits] = row.ratio, row.samples
    own: dict[int, Factors] = {}
    peers: dict[tuple, list[float]] = {}
    for device_id, (ratios, by_bits, samples, device) in measured.items():
        factor = statistics.median(ratios)
        own[device_id] = Factors(factor, by_bits, samples, "measured")
        peers.setdefault(("model", device.model_name, device.emulated), []).append(factor)
        peers.setdefault(("kind", device.emulated), []).append(factor)
    return Calibrations(own, {key: statistics.median(values) for key, values in peers.items()})
