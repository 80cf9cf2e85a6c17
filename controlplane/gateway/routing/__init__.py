"""The gateway's router: pure Python (no Django, no asyncio), so the views, the tests and the
benchmark's simulator all drive the very same decisions.

``Router.route(request, deadline_s=...)`` returns a ``Decision`` (the replica to use) or a
``Rejection`` (answer 400/429/503 at once), each with the inputs it saw for every replica
(``ReplicaInputs``). A request's ``RequestShape`` may carry its prompt (``PromptPrefix``) and a
replica the summary of what its head caches (``ReplicaState.prefix_summary``): only the tokens not
cached there count as its prefill. ``signals`` turns the agents' telemetry of a replica's stages
and devices into its ``ReplicaHealth`` and measured costs. The caller tells each replica's
``ReplicaState`` what happened to the request (first token, each token, finish) so that the load
figures stay current.

The strategies' names (what a deployment stores) come from ``contracts.routing``
(``ROUTING_STRATEGIES``, ``DEFAULT_ROUTING_STRATEGY``); ``STRATEGIES`` maps each to its function.
"""

from controlplane.gateway.routing.costs import ReplicaCosts, RequestShape
from controlplane.gateway.routing.prefix import PromptPrefix
from controlplane.gateway.routing.router import Decision, Rejection, ReplicaInputs, Router
from controlplane.gateway.routing.signals import (
    DeviceSample,
    MeasuredCosts,
    Reading,
    StageLink,
    StageSample,
    replica_reading,
)
from controlplane.gateway.routing.state import PeerLoad, ReplicaHealth, ReplicaState
from controlplane.gateway.routing.strategies import PREFIX_BLIND, STRATEGIES

__all__ = [
    "PREFIX_BLIND",
    "STRATEGIES",
    "Decision",
    "DeviceSample",
    "MeasuredCosts",
    "PeerLoad",
    "PromptPrefix",
    "Reading",
    "Rejection",
    "ReplicaCosts",
    "ReplicaHealth",
    "ReplicaInputs",
    "ReplicaState",
    "RequestShape",
    "Router",
    "StageLink",
    "StageSample",
    "replica_reading",
]
