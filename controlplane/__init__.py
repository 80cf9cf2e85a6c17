"""motley's control plane: a Django project whose apps each own one domain (see docs/architecture.md)."""
