"""The shared cache's backends (settings.CACHES): JSON values in Redis, batched writes to files.

Django's ``RedisSerializer`` pickles every value but an int; ``JsonSerializer`` writes JSON, so
nothing read from the network is unpickled and a value must be JSON (the telemetry samples are: they
arrived as JSON). Ints stay plain JSON numbers, which Redis's INCR reads, so ``cache.incr`` still works.

``FileCache`` is the embedded default: Django's ``FileBasedCache``, whose ``set`` lists the whole
cache directory to decide whether to cull before every write. The telemetry keeper writes the latest
sample of every node a few times a second (``telemetry.services.telemetry_keep_many``): at 1,250 nodes
that listing, once per node, cost more CPU than the rest of ingest. ``set_many`` here lists the
directory once per batch and writes each file as ``set`` does: a file of its own renamed over the
entry, so a reader never sees half a value.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.filebased import FileBasedCache


class JsonSerializer:
    def dumps(self, obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        return json.loads(data)


class FileCache(FileBasedCache):
    """``FileBasedCache`` whose ``set_many`` culls once per batch rather than once per key."""

    def set_many(self, data: dict[str, Any], timeout=DEFAULT_TIMEOUT, version=None) -> list[str]:
        self._createdir()  # the directory can be deleted at any time
        self._cull()
        suffix = f".{os.getpid()}-{threading.get_ident()}.tmp"  # this writer's own, never listed as an entry
        for key, value in data.items():
            fname = self._key_to_file(key, version)
            try:
                with open(fname + suffix, "wb") as f:
                    self._write_content(f, timeout, value)
                os.replace(fname + suffix, fname)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(fname + suffix)
                raise
        return []
