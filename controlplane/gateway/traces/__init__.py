"""The control plane's keeper of recent sampled traces: the dashboard's request timeline without an
external tracing server (docs/observability.md, "Request timeline")."""
