"""The gateway's settings: ``settings.MOTLEY_GATEWAY`` (a dict) over these defaults, the only ones
(docs/configuration.md lists them all).

``DEADLINE_S``: every request's deadline (504 past it); ``SERVED_MODELS``: dotted path of the
callable listing the served models and their replica endpoints (see directory.py; the default
serves the controller's deployments); ``MODELS_FILE``: a JSON file to serve instead (None:
``MOTLEY_GATEWAY_MODELS_FILE``);
``CLIENT``: dotted path of the pipeline client class (contracts §2); ``REFRESH_S``: how often
the served models and the heads' statistics are re-read; ``HEALTH_REFRESH_S``: how often the agents'
telemetry is re-read into each replica's health and costs; ``TELEMETRY_STALE_S``: a replica whose
stages' or devices' latest sample is older is unhealthy (None: ``MOTLEY_TELEMETRY_STALE_AFTER_S``);
``LIVE_TELEMETRY``: False routes blind to the telemetry; ``COSTS_MIN_SAMPLES``: telemetry samples
with steps needed before a replica's measured costs replace its planned ones;
``DEFAULT_CHAT_MAX_TOKENS``: a chat request's output budget when it sets none (capped by the context
left); ``QUOTA_WINDOW_S``: the length of the keys' rate-limit windows ("per minute": 60; tests shorten
it). ``WAIT_S``: how long a request waits for a routable replica of a model that has none now
(waiting.py); ``MAX_WAITING``: the most requests of one model that may wait (the queue's bound
from the plan's capacity, shedding.py, is lower); ``WAIT_POLL_S``: how often the served models and
heads are re-read while requests wait; ``WAIT_HEAD_POLL_S``: how often, while
requests wait, a head that has not said ok is asked again (its pipeline serving again is what they
wait for: a handover's pause as clients see it ends within this of the head's ok);
``RETRY_AFTER_S``: the ``Retry-After`` of a refusal when the gateway has nothing to compute it
from (no request of the model ended recently, no healthy replica; shedding.py); ``MAX_MIGRATIONS``:
how many times a request whose pipeline broke is resumed on another replica (generation.py) before
it fails.
``KEY_GRACE_S``: how long a key read active may be used while the database cannot be read
(selectors.py); a request that needs the database past that gets a 503. The limits (limits.py;
``None`` lifts one): ``MAX_BODY_BYTES``, the largest ``/v1/`` request body; ``MAX_TOKENS``, the most
output tokens a request may ask for; ``MAX_CONCURRENT_REQUESTS_PER_KEY``, one key's requests in flight at
once in a gateway process for keys without their own ``max_concurrent_requests`` (None: no limit).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "DEADLINE_S": 120.0,
    "SERVED_MODELS": "controlplane.gateway.serving.deployments_source.served_models",
    "MODELS_FILE": None,
    "CLIENT": "controlplane.gateway.serving.pipeline_client.PipelineClient",
    "CLIENT_TIMEOUT_S": 5.0,
    "REFRESH_S": 2.0,
    "HEALTH_REFRESH_S": 0.5,
    "TELEMETRY_STALE_S": None,
    "LIVE_TELEMETRY": True,
    "COSTS_MIN_SAMPLES": 3,
    "DEFAULT_CHAT_MAX_TOKENS": 256,
    "QUOTA_WINDOW_S": 60.0,
    # Longer than a lost node takes to be re-planned and served again (MOTLEY_NODE_LOST_AFTER_S 15 s,
    # then the new stages' start): a request caught by a dead agent waits that out instead of failing.
    "WAIT_S": 60.0,
    "MAX_WAITING": 256,
    "WAIT_POLL_S": 0.1,
    "WAIT_HEAD_POLL_S": 0.02,
    "RETRY_AFTER_S": 5,
    "MAX_MIGRATIONS": 3,
    "KEY_GRACE_S": 300.0,
    "MAX_BODY_BYTES": 1024 * 1024,
    "MAX_TOKENS": 32768,
    "MAX_CONCURRENT_REQUESTS_PER_KEY": None,
}


def gateway_setting(name: str) -> Any:
    value = {**DEFAULTS, **settings.MOTLEY_GATEWAY}[name]
    if name == "MODELS_FILE" and value is None:
        return settings.MOTLEY_GATEWAY_MODELS_FILE
    return value
