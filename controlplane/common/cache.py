"""The shared cache's JSON serializer for Redis (settings.CACHES, service mode).

Django's ``RedisSerializer`` pickles every value but an int; ``JsonSerializer`` writes JSON, so
nothing read from the network is unpickled and a value must be JSON (the telemetry samples are: they
arrived as JSON). Ints stay plain JSON numbers, which Redis's INCR reads, so ``cache.incr`` still works.
The embedded default's cache (``sqlite_cache.SqliteCache``) keeps JSON too, so both run modes hold
the same values.
"""

from __future__ import annotations

from typing import Any

from controlplane.common import json_text


class JsonSerializer:
    def dumps(self, obj: Any) -> bytes:
        return json_text.dumps(obj).encode()

    def loads(self, data: bytes) -> Any:
        return json_text.loads(data)
