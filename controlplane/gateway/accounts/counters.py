"""Counters every gateway process shares, checked and incremented in one atomic step.

The quotas (quotas.py) count requests and tokens per key in Django's default cache, which every process
of an installation shares (settings.CACHES): Redis in service mode, a SQLite file under ``var/cache/`` in
the embedded default. ``CounterStore.admit`` takes a list of ``Check``s and either increments all of them
or none: a check whose counter would pass its limit refuses the lot, so a refused request never
counts and two processes can never both take the last unit.

- Redis: one Lua script (GET every counter, compare, INCRBY all, set the TTL of new ones), which Redis
  runs atomically: one round trip, exact across any number of processes and hosts.
- Any other cache (the SQLite one, the tests' in-memory one): get and set under a lock, a process-wide
  one plus, for the SQLite cache, an ``fcntl`` lock on a file in its directory, so every process on
  the machine that shares ``var/cache/`` takes turns. A memory cache is per process, and so are its limits.

A counter may be ``seeded``: when it is missing (a cache that lost it, or the first use in a period)
``admit`` answers ``missing`` instead of starting it from 0, and the caller ``seed``s it from the
database before asking again (the token budget: quotas.py).
"""

from __future__ import annotations

import fcntl
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from django.core.cache import BaseCache
from django.core.cache import cache as default_cache
from django.core.cache.backends.redis import RedisCache

from controlplane.common.sqlite_cache import SqliteCache

LOCK_FILE = "motley-counters.lock"  # beside the SQLite cache's file


@dataclass(frozen=True)
class Check:
    key: str  # a cache key (the cache's prefix and version are added as for any key)
    delta: int
    limit: int | None  # None: count, never refuse
    ttl_s: int  # a new counter expires this long after it started
    seeded: bool = False  # a missing counter is reported (``missing``) rather than started at 0


@dataclass(frozen=True)
class Outcome:
    admitted: bool
    values: tuple[int, ...] = ()  # admitted: each counter after the increment
    refused: int | None = None  # index of the first check that would pass its limit
    current: int = 0  # that counter's value now
    missing: int | None = None  # index of the first seeded counter that does not exist


ADMIT = """
local n = #KEYS
local current = {}
for i = 1, n do
  local delta, limit, seeded = tonumber(ARGV[4*i-3]), tonumber(ARGV[4*i-2]), ARGV[4*i]
  local value = redis.call('GET', KEYS[i])
  if not value then
    if seeded == '1' then return {-2, i - 1, 0} end
    value = 0
  else
    value = tonumber(value)
  end
  if limit >= 0 and value + delta > limit then return {-1, i - 1, value} end
  current[i] = value
end
local out = {0}
for i = 1, n do
  out[i + 1] = redis.call('INCRBY', KEYS[i], ARGV[4*i-3])
  if redis.call('TTL', KEYS[i]) < 0 then redis.call('EXPIRE', KEYS[i], ARGV[4*i-1]) end
end
return out
"""

ADJUST = """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[i]) end
end
return 0
"""


class CounterStore:
    """Atomic multi-counter admission over one Django cache (the default one unless given)."""

    _process_lock = threading.Lock()

    def __init__(self, cache: BaseCache | None = None) -> None:
        self.cache = cache if cache is not None else default_cache

    def admit(self, checks: list[Check]) -> Outcome:
        if not checks:
            return Outcome(True)
        if isinstance(self.cache, RedisCache):
            keys = [self.cache.make_and_validate_key(c.key) for c in checks]
            args = [x for c in checks for x in (c.delta, -1 if c.limit is None else c.limit, c.ttl_s,
                                                int(c.seeded))]
            reply = [int(x) for x in self._redis(keys[0]).eval(ADMIT, len(keys), *keys, *args)]
            if reply[0] == 0:
                return Outcome(True, tuple(reply[1:]))
            if reply[0] == -2:
                return Outcome(False, missing=reply[1])
            return Outcome(False, refused=reply[1], current=reply[2])
        with self._locked():
            current = []
            for i, check in enumerate(checks):
                value = self.cache.get(check.key)
                if value is None and check.seeded:
                    return Outcome(False, missing=i)
                value = int(value or 0)
                if check.limit is not None and value + check.delta > check.limit:
                    return Outcome(False, refused=i, current=value)
                current.append(value)
            for check, value in zip(checks, current):
                self.cache.set(check.key, value + check.delta, check.ttl_s)
            return Outcome(True, tuple(v + c.delta for v, c in zip(current, checks)))

    def adjust(self, deltas: list[tuple[str, int, int]]) -> None:
        """Add ``delta`` to each ``(key, delta, ttl_s)`` counter that still exists (a correction to a
        window that expired is moot); ``ttl_s`` bounds a generic cache's rewritten entry."""
        deltas = [(key, delta, ttl_s) for key, delta, ttl_s in deltas if delta]
        if not deltas:
            return
        if isinstance(self.cache, RedisCache):
            keys = [self.cache.make_and_validate_key(key) for key, _, _ in deltas]
            self._redis(keys[0]).eval(ADJUST, len(keys), *keys, *[delta for _, delta, _ in deltas])
            return
        with self._locked():
            for key, delta, ttl_s in deltas:
                if (value := self.cache.get(key)) is not None:
                    self.cache.set(key, int(value) + delta, ttl_s)

    def seed(self, key: str, value: int, ttl_s: int) -> None:
        """Start a counter at ``value`` unless another process just did."""
        self.cache.add(key, value, ttl_s)

    def get(self, key: str) -> int | None:
        value = self.cache.get(key)
        return None if value is None else int(value)

    def _redis(self, key: str):
        return self.cache._cache.get_client(key, write=True)

    @contextmanager
    def _locked(self):
        with self._process_lock:
            if not isinstance(self.cache, SqliteCache):
                yield
                return
            directory = Path(self.cache.directory)
            directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
