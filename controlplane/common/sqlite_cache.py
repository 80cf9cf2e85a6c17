"""The embedded default's shared cache: one SQLite file (``var/cache/cache.sqlite3``) that every process
of the installation on this machine reads and writes (the ASGI server, the Celery worker and beat).

Why not Django's ``FileBasedCache``: it stores an entry as a file, and a write creates a file and
renames it over the entry. The telemetry keeper writes the latest sample of every node each second
(``telemetry.services.telemetry_keep_many``): on an ext4 disk each of those writes cost 0.7 ms of
kernel time, so at 1,250 nodes (10,000 GPUs) the keeper alone wanted most of a core. Here a batch is
one transaction of upserts (tens of microseconds an entry), a read of every node one query, and
``add`` is atomic across processes (a file cache's is not).

Values are JSON, as in Redis (``cache.JsonSerializer``), so both run modes keep the same values; a
value JSON cannot write is refused (``TypeError``) before anything of its batch is written. The file
is in WAL mode, where readers never wait for the writer and ``synchronous=NORMAL`` skips the fsync of
every commit: a cache may lose its last writes to a power cut, never its consistency. Each thread
opens its own connection (again in a forked child); expired entries are deleted every
``CULL_EVERY_WRITES`` writes of a process, and past ``MAX_ENTRIES`` the soonest to expire go.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache

from controlplane.common import json_text

CULL_EVERY_WRITES = 200
_BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another process's write to finish
_IN_CHUNK = 500  # keys per SELECT ... IN: under SQLite's limit on a statement's parameters
_LIVE = "(expires IS NULL OR expires > ?)"
_SCHEMA = ("CREATE TABLE IF NOT EXISTS cache_entries "
           "(key TEXT PRIMARY KEY, expires REAL, value TEXT NOT NULL) WITHOUT ROWID")
_UPSERT = ("INSERT INTO cache_entries (key, expires, value) VALUES (?, ?, ?) "
           "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires, value = excluded.value")
_ADD = ("INSERT INTO cache_entries (key, expires, value) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires, value = excluded.value "
        "WHERE cache_entries.expires IS NOT NULL AND cache_entries.expires <= ?")


class SqliteCache(BaseCache):
    """Django cache backend on one SQLite file; ``LOCATION`` is the file's path."""

    def __init__(self, location: str, params: dict[str, Any]):
        super().__init__(params)
        self.path = location
        self.directory = os.path.dirname(os.path.abspath(location))
        self._local = threading.local()
        self._writes = 0

    # -- reads ----------------------------------------------------------------------------------
    def get(self, key, default=None, version=None):
        key = self.make_and_validate_key(key, version=version)
        row = self._connection().execute(
            f"SELECT value FROM cache_entries WHERE key = ? AND {_LIVE}", (key, time.time())).fetchone()
        return default if row is None else json_text.loads(row[0])

    def get_many(self, keys: Iterable[str], version=None) -> dict[str, Any]:
        wanted = {self.make_and_validate_key(key, version=version): key for key in keys}
        names, found, now = list(wanted), {}, time.time()
        connection = self._connection()
        for i in range(0, len(names), _IN_CHUNK):
            chunk = names[i:i + _IN_CHUNK]
            rows = connection.execute(f"SELECT key, value FROM cache_entries WHERE key IN "
                                      f"({','.join('?' * len(chunk))}) AND {_LIVE}", (*chunk, now))
            found.update((wanted[key], json_text.loads(value)) for key, value in rows)
        return found

    def has_key(self, key, version=None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        row = self._connection().execute(f"SELECT 1 FROM cache_entries WHERE key = ? AND {_LIVE}",
                                         (key, time.time())).fetchone()
        return row is not None

    # -- writes ---------------------------------------------------------------------------------
    def set(self, key, value, timeout=DEFAULT_TIMEOUT, version=None) -> None:
        self.set_many({key: value}, timeout, version)

    def set_many(self, data: dict[str, Any], timeout=DEFAULT_TIMEOUT, version=None) -> list[str]:
        expires = self.get_backend_timeout(timeout)
        rows = [(self.make_and_validate_key(key, version=version), expires, json_text.dumps(value))
                for key, value in data.items()]  # every value serialized before anything is written
        with self._transaction(len(rows)) as connection:
            connection.executemany(_UPSERT, rows)
        return []

    def add(self, key, value, timeout=DEFAULT_TIMEOUT, version=None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        row = (key, self.get_backend_timeout(timeout), json_text.dumps(value), time.time())
        with self._transaction(1) as connection:
            return connection.execute(_ADD, row).rowcount == 1

    def touch(self, key, timeout=DEFAULT_TIMEOUT, version=None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        with self._transaction(1) as connection:
            return connection.execute(f"UPDATE cache_entries SET expires = ? WHERE key = ? AND {_LIVE}",
                                      (self.get_backend_timeout(timeout), key, time.time())).rowcount == 1

    def delete(self, key, version=None) -> bool:
        key = self.make_and_validate_key(key, version=version)
        with self._transaction(0) as connection:
            return connection.execute(f"DELETE FROM cache_entries WHERE key = ? AND {_LIVE}",
                                      (key, time.time())).rowcount == 1

    def clear(self) -> None:
        with self._transaction(0) as connection:
            connection.execute("DELETE FROM cache_entries")

    def close(self, **kwargs) -> None:
        """Kept open: Django closes caches after every request, and a connection costs a file open
        and its pragmas; a thread's connection closes when the thread ends."""

    # -- plumbing -------------------------------------------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # a new thread, or a forked child
            os.makedirs(self.directory, exist_ok=True)
            connection = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None,
                                         check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
            local.connection, local.pid = connection, os.getpid()
        return local.connection

    @contextmanager
    def _transaction(self, writes: int) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (no reader-turned-writer deadlock); ``writes`` entries
        written count towards the next cull, which runs inside it."""
        connection = self._connection()
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
            self._writes += writes
            if self._writes >= CULL_EVERY_WRITES:
                self._writes = 0
                self._cull(connection)
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _cull(self, connection: sqlite3.Connection) -> None:
        connection.execute("DELETE FROM cache_entries WHERE expires IS NOT NULL AND expires <= ?",
                           (time.time(),))
        (count,) = connection.execute("SELECT COUNT(*) FROM cache_entries").fetchone()
        if count > self._max_entries:
            doomed = count // self._cull_frequency if self._cull_frequency else count
            connection.execute("DELETE FROM cache_entries WHERE key IN (SELECT key FROM cache_entries "
                               "ORDER BY expires IS NULL, expires LIMIT ?)", (doomed,))
