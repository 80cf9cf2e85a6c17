"""The embedded default's shared cache (controlplane.common.sqlite_cache.SqliteCache): Django's cache
API on one SQLite file, JSON values, expiry, an atomic ``add``, and what one process writes another
reads."""

from __future__ import annotations

import multiprocessing

import pytest

from controlplane.common import sqlite_cache
from controlplane.common.sqlite_cache import SqliteCache


@pytest.fixture
def location(tmp_path) -> str:
    return str(tmp_path / "cache" / "cache.sqlite3")  # the directory is made on first use


def test_batches_and_single_entries_read_back_as_json(location):
    cache = SqliteCache(location, {"OPTIONS": {"MAX_ENTRIES": 10_000}})
    samples = {f"telemetry:node:n{i}": {"node": f"n{i}", "devices": [{"index": 0, "power_w": i * 1.5}]}
               for i in range(1200)}  # more keys than one SELECT ... IN takes
    cache.set_many(samples, 30)
    cache.set("telemetry:node:n7", {"node": "n7", "devices": []}, 30)  # replaced whole
    found = cache.get_many([*samples, "never:written"])
    assert len(found) == 1200 and "never:written" not in found
    assert found["telemetry:node:n1199"] == samples["telemetry:node:n1199"]
    assert found["telemetry:node:n7"] == {"node": "n7", "devices": []}
    cache.set("pair", ("a", 1))
    assert cache.get("pair") == ["a", 1]  # JSON, as Redis keeps it in service mode
    assert cache.get("missing", "default") == "default"


def test_a_value_json_cannot_write_leaves_its_whole_batch_unwritten(location):
    cache = SqliteCache(location, {})
    cache.set("kept", 1)
    with pytest.raises(TypeError, match="not JSON serializable"):
        cache.set_many({"kept": 2, "object": object()}, 30)
    assert cache.get("kept") == 1 and cache.get("object") is None


def test_entries_expire_and_touch_delete_and_clear_act_on_live_ones(location, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sqlite_cache.time, "time", lambda: now[0])
    cache = SqliteCache(location, {})
    cache.set("short", "a", 10)
    cache.set("forever", "b", None)
    cache.set("gone", "c", 0)  # Django: a timeout of 0 expires at once
    assert cache.get("gone") is None and cache.has_key("short")
    assert cache.touch("short", 100)
    now[0] += 50
    assert cache.get("short") == "a" and cache.get("forever") == "b"
    now[0] += 60
    assert cache.get("short") is None and not cache.has_key("short") and not cache.touch("short", 10)
    assert cache.delete("forever") and not cache.delete("forever")
    cache.set("again", 1)
    cache.clear()
    assert cache.get("again") is None


def test_add_writes_only_a_missing_or_expired_entry(location, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sqlite_cache.time, "time", lambda: now[0])
    cache = SqliteCache(location, {})
    assert cache.add("seed", 5, 10)
    assert not cache.add("seed", 0, 10) and cache.get("seed") == 5
    now[0] += 11
    assert cache.add("seed", 7, 10) and cache.get("seed") == 7
    assert cache.incr("seed", 3) == 10


def test_a_cull_drops_the_expired_then_the_soonest_to_expire_past_the_limit(location, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(sqlite_cache.time, "time", lambda: now[0])
    monkeypatch.setattr(sqlite_cache, "CULL_EVERY_WRITES", 1)
    cache = SqliteCache(location, {"OPTIONS": {"MAX_ENTRIES": 10, "CULL_FREQUENCY": 2}})
    cache.set_many({f"old{i}": i for i in range(5)}, 5)
    now[0] += 10  # the five old ones expired
    cache.set("forever", 1, None)
    cache.set_many({f"k{i}": i for i in range(12)}, 100)  # 13 live > 10: 6 go, the soonest to expire
    (count,) = cache._connection().execute("SELECT COUNT(*) FROM cache_entries").fetchone()
    assert count == 7 and cache.get("forever") == 1


def _write(location: str, node: str) -> None:
    SqliteCache(location, {}).set_many({f"telemetry:node:{node}": {"node": node}}, 30)


def test_what_one_process_writes_another_reads(location):
    cache = SqliteCache(location, {})
    cache.set("before", 1)  # this process's connection is open before the child forks
    child = multiprocessing.get_context("fork").Process(target=_write, args=(location, "n1"))
    child.start()
    child.join(timeout=30)
    assert child.exitcode == 0
    assert cache.get("telemetry:node:n1") == {"node": "n1"}
    _write(location, "n2")
    assert cache.get_many(["telemetry:node:n1", "telemetry:node:n2"]) == {
        "telemetry:node:n1": {"node": "n1"}, "telemetry:node:n2": {"node": "n2"}}
