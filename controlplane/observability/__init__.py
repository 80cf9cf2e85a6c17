"""Prometheus metrics of the control plane and the gateway (docs/observability.md).

- ``serving``: the request metrics the gateway records as requests go (vLLM's names and meanings:
  ``vllm:time_to_first_token_seconds``, ``vllm:num_requests_running``, …, by model and replica) and
  the router's decisions; in multiprocess mode every process writes them to ``PROMETHEUS_MULTIPROC_DIR``.
- ``fleet`` and ``pipeline``: ``motley_*`` gauges computed at scrape time from the shared telemetry
  (``controlplane.telemetry.selectors``) and the database, so every process serves the same values.
- ``exposition``: the registry one scrape reads; ``views``: ``/metrics``, behind a token or an
  allow-list of client addresses.
"""
