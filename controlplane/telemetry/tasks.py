"""Celery interface of telemetry: the calibration pass (beat, every ``MOTLEY_CALIBRATION_INTERVAL_S``).

Its name comes from ``contracts/tasks.py``, where the beat schedule in settings finds it too.
"""

from __future__ import annotations

from celery import shared_task

from contracts import tasks as names
from controlplane.telemetry.calibration import calibration_fit


@shared_task(name=names.CALIBRATE)
def calibrate() -> int:
    """Fold every fresh stage sample into its device's calibration; returns the observations made."""
    return calibration_fit()
