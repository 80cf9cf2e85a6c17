"""API keys and what they may spend: the keys (services, selectors, their API), quotas and their
counters, usage per key and model (recorded, queued for the database, reported)."""
