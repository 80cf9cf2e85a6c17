"""JSON values in the shared Redis cache (settings.CACHES): nothing read from the network is unpickled.

Django's ``RedisSerializer`` pickles every value but an int; this one writes JSON, so a value must be
JSON (the telemetry samples are: they arrived as JSON). Ints stay plain JSON numbers, which Redis's
INCR reads, so ``cache.incr`` still works.
"""

from __future__ import annotations

import json
from typing import Any


class JsonSerializer:
    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)
