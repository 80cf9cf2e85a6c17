"""The embedded default broker: kombu's filesystem transport, read safely (docs/architecture.md)."""
