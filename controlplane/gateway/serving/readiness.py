"""Whether the gateway can serve anything now: the answer of ``GET /health``.

It can when at least one served model has a replica the router may choose (its head said the
pipeline serves and its telemetry is fresh). Otherwise the reason is one of a few fixed sentences:
``/health`` answers without a key (a load balancer or a Kubernetes probe holds none), so it names no
model, replica, address or health detail; those are in ``GET /api/v1/gateway/router/`` for operators.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import DatabaseError

from controlplane.gateway.serving.runtime import gateway

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Readiness:
    ok: bool
    reason: str = ""


async def gateway_readiness() -> Readiness:
    try:
        routes = await gateway().all_routes()
    except DatabaseError as exc:
        log.warning("health: the served models cannot be read: %s", exc)
        return Readiness(False, "the control plane's database cannot be reached")
    if not routes:
        return Readiness(False, "no model is deployed")
    replicas = [replica for route in routes for replica in route.router.replicas]
    if not replicas:
        return Readiness(False, "no deployment has a replica yet (deploying or re-planning)")
    if not any(replica.health.ok for replica in replicas):
        return Readiness(False, "no replica of any served model is healthy")
    return Readiness(True)
