"""Which models the gateway serves and where their replicas listen: the gateway's one input.

The gateway depends only on ``ServedModel`` / ``ReplicaEndpoint`` and a zero-argument callable
returning the list (``MOTLEY_GATEWAY["SERVED_MODELS"]``, a dotted path). The default
(``deployments_source.served_models``) reads the controller's READY deployments, with each
replica's costs from its plan's predictions; for tests, benchmarks and fixed setups a JSON file
(``MOTLEY_GATEWAY["MODELS_FILE"]``) names them, with the costs it states:

    {"models": [{"name": "demo", "tokenizer_path": "/ckpt", "strategy": "cost_aware",
                 "replicas": [{"pipeline_id": "d1-r0", "head_address": "tcp://127.0.0.1:5601",
                               "auth_token": "…", "kv_tokens": 2048,
                               "costs": {"prefill_s_per_token": 0.0005, "decode_s_per_token": 0.001,
                                         "decode_step_s": 0.02},
                               "stages": [{"stage_key": "d1-r0-s0", "device": "n0/gpu0"}]}]}]}

A replica's ``stages`` (optional) name where its stages run, so the gateway can read their agents'
telemetry (live_health.py); a replica without them is judged by its head's statistics alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from contracts.routing import DEFAULT_ROUTING_STRATEGY
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.routing import ReplicaCosts, ReplicaHealth, StageLink

# The costs assumed for a replica whose source gives none (a plan without predictions, a models-file
# entry without "costs"): a small model on a fast GPU, not a measurement (the gateway scales them by
# measured / assumed once the replica's stages report step times). Only the ratios between replicas
# matter to the choice; the absolute figures matter to the deadline admission.
ASSUMED_COSTS = ReplicaCosts(prefill_s_per_token=0.0002, decode_s_per_token=0.0005, decode_step_s=0.02)


@dataclass(frozen=True)
class ReplicaEndpoint:
    """One pipeline replica: its head (stage 0) address and the token its frames are signed with.

    ``kv_tokens``: the smallest stage's KV budget (None: learned from the head's statistics);
    ``costs``: the plan's predicted costs, or a models file's, else ``ASSUMED_COSTS``, and
    ``costs_source`` says which ("planned", "stated", "assumed"; the gateway replaces them with
    measured ones once the stages' telemetry allows); ``health``: throttling, memory pressure and
    errors as the source states them (a models file may; the deployments source leaves the default);
    ``stages``: where the replica's stages run (the deployments source fills it), whose telemetry
    the gateway reads; ``successor``: of a replica being handed over beside (stated unhealthy), the
    replica that takes its place: until the gateway has heard that one's head say ok, this one is
    routed to as if it were healthy (live_health.py).
    """

    pipeline_id: str
    head_address: str
    auth_token: str
    kv_tokens: int | None = None
    costs: ReplicaCosts = ASSUMED_COSTS
    health: ReplicaHealth = field(default_factory=ReplicaHealth)
    costs_source: str = "assumed"
    stages: tuple[StageLink, ...] = ()
    successor: str | None = None


@dataclass(frozen=True)
class ServedModel:
    """A model the gateway answers for. ``replicas`` may be empty (its deployment is deploying, being
    re-planned, failed): requests then wait for one (waiting.py), and ``reason`` says why there is none
    (the 503 after the wait quotes it). ``cannot_serve``: no replica is routable and none is coming
    (its deployments failed, or lost a node and found no plan that fits): requests get the 503 at
    once instead of waiting (admission.py)."""

    name: str
    tokenizer_path: str
    replicas: tuple[ReplicaEndpoint, ...]
    strategy: str = DEFAULT_ROUTING_STRATEGY
    reason: str = ""
    cannot_serve: bool = False


def served_model_from_dict(data: dict) -> ServedModel:
    replicas = tuple(
        ReplicaEndpoint(
            pipeline_id=r["pipeline_id"],
            head_address=r["head_address"],
            auth_token=r["auth_token"],
            kv_tokens=r.get("kv_tokens"),
            costs=ReplicaCosts(**r["costs"]) if r.get("costs") else ASSUMED_COSTS,
            health=ReplicaHealth(**r.get("health", {})),
            costs_source="stated" if r.get("costs") else "assumed",
            stages=tuple(StageLink(**s) for s in r.get("stages", ())),
        )
        for r in data["replicas"]
    )
    strategy = data.get("strategy", DEFAULT_ROUTING_STRATEGY)
    return ServedModel(data["name"], data["tokenizer_path"], replicas, strategy, data.get("reason", ""),
                       bool(data.get("cannot_serve", False)))


def served_models_from_file() -> list[ServedModel]:
    """The JSON file named by the settings, or nothing when none is set."""
    path = gateway_setting("MODELS_FILE")
    if not path or not Path(path).exists():
        return []
    return [served_model_from_dict(m) for m in json.loads(Path(path).read_text())["models"]]
