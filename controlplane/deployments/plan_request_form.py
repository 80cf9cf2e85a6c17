"""The stored form of a plan request (everything but the fleet and the model) and back.

Kept apart because three places share the form and none owns it: the plans API takes a request in
it, a plan revision keeps it, and the controller turns it back into a ``PlanRequest`` on the fleet
as it is now (``revisions.py``), so that a re-plan after a failure asks the planner the same
question. The form is the body the plans API takes (POST /api/v1/plans/, less ``model``), so a
request travels unchanged from the API or the plan editor into a revision:

    {"batch": 8, "context": 4096, "prompt_tokens": null, "objective": "throughput",
     "bits": [16, 8, 4], "max_quantized": 0.5, "quality": null, "replicas": "auto",
     "pins": [{"device": "n1/gpu0", "start": 0, "end": 8}], "exclude_nodes": [], "exclude_devices": [],
     "tensor_parallel": false}

Every key is optional; missing ones take the planner's defaults. The host memory each stage may give
the KV host tier is not part of the form: it is the install's (``MOTLEY_HOST_KV_GIB``); nor is
speculation: it is the deployment's (``plans.selectors.deployment_speculation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.conf import settings

from contracts.hardware import GIB, FleetSpec
from contracts.model_profile import ModelProfile
from controlplane.planning import Pin, PlanningError, PlanRequest, Workload
from controlplane.planning.speculation import Speculation

WORKLOAD_KEYS = ("batch", "context", "prompt_tokens")
RULE_KEYS = ("objective", "bits", "max_quantized", "quality", "replicas", "pins", "exclude_nodes",
             "exclude_devices", "tensor_parallel")
REQUEST_KEYS = WORKLOAD_KEYS + RULE_KEYS


def plan_request_from_dict(
    data: Mapping[str, Any],
    *,
    fleet: FleetSpec,
    profile: ModelProfile,
    exclude_nodes: tuple[str, ...] = (),
    exclude_devices: tuple[str, ...] = (),
    speculation: Speculation = Speculation(),
) -> PlanRequest:
    """A PlanRequest for this fleet and model, with more exclusions than the stored ones (a node being
    drained, devices other deployments use); PlanningError names a malformed or unknown field."""
    unknown = sorted(set(data) - set(REQUEST_KEYS))
    if unknown:
        raise PlanningError(
            f"request: unknown field(s) {', '.join(unknown)} (known: {', '.join(REQUEST_KEYS)})"
        )
    try:
        options: dict[str, Any] = {
            key: data[key] for key in ("objective", "max_quantized", "replicas") if key in data
        }
        options["workload"] = Workload(**{key: data[key] for key in WORKLOAD_KEYS if key in data})
        if data.get("quality") is not None:  # {"max_kl": x}: the measured quality budget
            quality = dict(data["quality"])
            if set(quality) - {"max_kl"}:
                raise ValueError(f"quality: unknown field(s) {sorted(set(quality) - {'max_kl'})} "
                                 "(known: max_kl)")
            if quality.get("max_kl") is not None:
                options["max_kl"] = float(quality["max_kl"])
        if not isinstance(data.get("tensor_parallel", False), bool):
            raise ValueError(f"tensor_parallel must be true or false, not {data['tensor_parallel']!r}")
        options["tensor_parallel"] = data.get("tensor_parallel", False)
        if "bits" in data:
            options["bits"] = tuple(int(b) for b in data["bits"])
        options["pins"] = tuple(Pin(**dict(p)) for p in data.get("pins", ()))
        options["exclude_nodes"] = tuple(data.get("exclude_nodes", ())) + tuple(exclude_nodes)
        options["exclude_devices"] = tuple(data.get("exclude_devices", ())) + tuple(exclude_devices)
    except (TypeError, ValueError) as exc:
        raise PlanningError(f"request: malformed ({exc})") from None
    return PlanRequest(fleet=fleet, model=profile, host_kv_bytes=int(settings.MOTLEY_HOST_KV_GIB * GIB),
                       speculation=speculation, **options)
