"""A deployment's service-level targets: what its requests should see, and how many replicas it may use.

The targets are the operator's statement of "fast enough": time to first token and time per output token
in milliseconds, met by a percentile (p95 or p99) of the requests of a window of seconds. ``priority``
orders deployments that compete for cards, ``min_replicas`` and ``max_replicas`` bound how far demand may
shrink or grow one. The demand signals (``demand.py``) measure attainment against them.
``emergency_max_kl`` is the quality the operator accepts to keep the model up when a lost card leaves
no room for it at its own precision (degrade.py): a measured KL budget, so it needs the model's
per-layer KL (``manage.py profile_quality``); null, the default, allows no lower precision. Checked here
once, for the API (services.py) and the admin (``Deployment.clean``) alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError

from contracts.model_profile import ModelProfile
from controlplane.deployments.degrade import measured_low_bits

PERCENTILES = (95, 99)
PERCENTILE_CHOICES = [(p, f"p{p}") for p in PERCENTILES]  # one choice set: the model's and the API's
DEFAULT_PERCENTILE = 95
DEFAULT_WINDOW_S = 300
MIN_WINDOW_S = 10  # a shorter window holds too few requests for a p95 to mean anything
MAX_WINDOW_S = 3600  # the gateway keeps its recent requests in memory, not hours of them
TARGET_FIELDS = ("ttft_target_ms", "tpot_target_ms", "target_percentile", "target_window_s", "priority",
                 "min_replicas", "max_replicas", "emergency_max_kl")


def targets_check(values: Mapping[str, Any], *, model) -> None:
    """Raise ValidationError naming each field that is out of range (``values``: every target field of a
    deployment of ``model``, an ``LlmModel``)."""
    errors: dict[str, str] = {}
    for name in ("ttft_target_ms", "tpot_target_ms"):
        if values[name] is not None and values[name] <= 0:
            errors[name] = "a positive number of milliseconds, or null for no target"
    if values["target_percentile"] not in PERCENTILES:
        errors["target_percentile"] = f"one of {', '.join(map(str, PERCENTILES))}"
    if not MIN_WINDOW_S <= values["target_window_s"] <= MAX_WINDOW_S:
        errors["target_window_s"] = f"between {MIN_WINDOW_S} and {MAX_WINDOW_S} seconds"
    if values["min_replicas"] < 1:
        errors["min_replicas"] = "at least 1"
    most = values["max_replicas"]
    if most is not None and most < values["min_replicas"]:
        errors["max_replicas"] = f"at least min_replicas ({values['min_replicas']}), or null for no bound"
    if (budget := values["emergency_max_kl"]) is not None:
        if not budget > 0:
            errors["emergency_max_kl"] = "a positive summed KL, or null to allow no lower precision"
        elif not measured_low_bits(ModelProfile.from_dict(model.profile)):
            errors["emergency_max_kl"] = (f"model {model.name} has no measured per-layer KL to hold the "
                                          f"budget to: run manage.py profile_quality {model.name} first")
    if errors:
        raise ValidationError(errors)


def targets_of(deployment) -> dict[str, Any]:
    """The deployment's target fields by name."""
    return {name: getattr(deployment, name) for name in TARGET_FIELDS}
