"""Names of the gateway's routing strategies: what a deployment stores and the gateway's router runs.

A deployment picks one (``Deployment.routing_strategy``); the router maps each name to its function
(``controlplane/gateway/routing/strategies.py``, which checks it implements exactly these). Kept
here so the deployments app names them without importing the gateway that reads deployments.
"""

ROUTING_STRATEGIES = ("cost_aware", "cost_aware_prefix_blind", "least_outstanding_tokens", "round_robin")
DEFAULT_ROUTING_STRATEGY = "cost_aware"
