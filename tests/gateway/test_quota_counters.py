"""The counters behind the key limits: all-or-nothing admission, exact under concurrency on the SQLite
cache (several processes on one machine, as the embedded default runs them) and on Redis (service mode)."""

from __future__ import annotations

import multiprocessing
import uuid

import pytest
from django.core.cache.backends.locmem import LocMemCache

from controlplane.common.sqlite_cache import SqliteCache
from controlplane.gateway.accounts.counters import Check, CounterStore
from tests.support.processes import redis_up, redis_url

REDIS_URL = redis_url(11)  # a database no other test uses


def stores(tmp_path) -> dict[str, CounterStore]:
    return {"memory": CounterStore(LocMemCache(uuid.uuid4().hex, {})),
            "sqlite": CounterStore(SqliteCache(str(tmp_path / "cache" / "cache.sqlite3"), {}))}


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store(request, tmp_path):
    if request.param != "redis":
        yield stores(tmp_path)[request.param]
        return
    if not redis_up():
        pytest.skip("needs a Redis server")
    from django.core.cache.backends.redis import RedisCache

    from controlplane.common.cache import JsonSerializer  # noqa: F401 (the settings' serializer)

    cache = RedisCache(REDIS_URL, {"KEY_PREFIX": f"t{uuid.uuid4().hex[:8]}",
                                   "OPTIONS": {"serializer": "controlplane.common.cache.JsonSerializer"}})
    yield CounterStore(cache)
    client = cache._cache.get_client(write=True)
    for key in client.scan_iter(f"{cache.key_prefix}:*"):
        client.delete(key)


def test_admission_counts_up_to_the_limit_and_refuses_without_counting(store):
    rpm = Check("k:rpm", 1, 3, 60)
    assert [store.admit([rpm]).values for _ in range(3)] == [(1,), (2,), (3,)]
    refused = store.admit([rpm])
    assert not refused.admitted and refused.refused == 0 and refused.current == 3
    assert store.get("k:rpm") == 3  # the refused one did not count


def test_all_or_nothing_across_counters(store):
    requests, tokens = Check("a:rpm", 1, 10, 60), Check("a:tpm", 40, 100, 60)
    assert store.admit([requests, tokens]).values == (1, 40)
    assert store.admit([requests, tokens]).values == (2, 80)
    refused = store.admit([requests, tokens])  # 120 tokens > 100: neither counter moves
    assert (refused.admitted, refused.refused, refused.current) == (False, 1, 80)
    assert (store.get("a:rpm"), store.get("a:tpm")) == (2, 80)
    assert store.admit([requests, Check("a:tpm", 20, 100, 60)]).values == (3, 100)


def test_a_seeded_counter_is_reported_missing_until_seeded(store):
    budget = Check("b:budget", 10, 100, 3600, seeded=True)
    outcome = store.admit([Check("b:rpm", 1, 5, 60), budget])
    assert outcome.missing == 1 and store.get("b:rpm") is None
    store.seed("b:budget", 95, 3600)
    store.seed("b:budget", 0, 3600)  # another process seeding later changes nothing
    assert not store.admit([budget]).admitted
    assert store.admit([Check("b:budget", 5, 100, 3600, seeded=True)]).values == (100,)


def test_adjust_corrects_existing_counters_only(store):
    store.admit([Check("c:tpm", 50, None, 60)])
    store.adjust([("c:tpm", -30, 60), ("c:gone", -5, 60)])
    assert store.get("c:tpm") == 20 and store.get("c:gone") is None


def _take(location: str, n: int, queue) -> None:
    store = CounterStore(SqliteCache(location, {}))
    queue.put(sum(store.admit([Check("race:rpm", 1, 50, 60)]).admitted for _ in range(n)))


def test_the_sqlite_cache_is_exact_across_processes(tmp_path):
    """Four processes race for 50 units of one counter: exactly 50 are admitted."""
    location = str(tmp_path / "cache" / "cache.sqlite3")
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    workers = [ctx.Process(target=_take, args=(location, 30, queue)) for _ in range(4)]
    for worker in workers:
        worker.start()
    admitted = sum(queue.get(timeout=60) for _ in workers)
    for worker in workers:
        worker.join(timeout=10)
    assert admitted == 50
    assert CounterStore(SqliteCache(location, {})).get("race:rpm") == 50
