"""Where the gateway processes of one installation keep the router view they share: Redis in service
mode (the server of the shared cache, ``MOTLEY_CACHE_URL``, which defaults to the channel layer's);
nowhere in the embedded default, whose one server process keeps its view in memory.

Keys are named per installation (``installation_prefix``: its database's name). Each process
writes its contribution (fleet_view.py: its load per replica, its recent outcomes, its
waiting requests) as one JSON value under its own key, ``SET … PX``, at every heartbeat
(``HEARTBEAT_S``), with a time to live of ``CONTRIBUTION_TTL_S``: a process that dies or hangs stops
refreshing its key, which expires, and its requests stop counting within that time. A set of process
ids indexes the keys; a reader drops an id whose key expired (a live process adds itself back at its
next heartbeat). Expiry is Redis's own clock, so the hosts' clocks need not agree. Ended decisions go
to one capped list every process reads for the router API. JSON only (nothing read from a network is
unpickled), and short socket timeouts: a slow Redis delays a heartbeat, never a request.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket

import redis
from django.conf import settings
from django.db import connection

HEARTBEAT_S = 0.2  # how often a process publishes its contribution and reads the others'
CONTRIBUTION_TTL_S = 3.0  # a process silent this long no longer counts
DECISIONS_KEPT = 200  # ended decisions of every process, newest last
PREFIX = "motley:gateway:fleet"
SOCKET_TIMEOUT_S = 0.5


def process_id() -> str:
    """This gateway process, as the router view and its decisions name it: host and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def installation_prefix() -> str:
    """The keys of this installation's gateways: one Redis server may serve several installations (or
    test databases), whose replicas' names repeat and must not add up."""
    return f"{PREFIX}:{connection.settings_dict['NAME']}"


def shared_url() -> str | None:
    """The Redis server the gateway processes share (service mode); None in the embedded default."""
    url = settings.MOTLEY_CACHE_URL
    return url if url.startswith(("redis://", "rediss://", "unix://")) else None


class FleetStore:
    """The contributions of every live gateway process and their ended decisions, in Redis.

    Through the blocking client, each call in a worker thread: a gateway serves from more than one
    event loop (the heartbeat's; under a handler that runs each request on a loop of its own, the
    router API's), and an asyncio connection belongs to the loop that opened it; a heartbeat cancelled
    mid-command (its loop closing) could leave that loop waiting on the connection forever. A thread's
    command ends by itself within the socket timeout, whatever happens to the task that awaited it."""

    def __init__(self, url: str, *, prefix: str = PREFIX, ttl_s: float = CONTRIBUTION_TTL_S) -> None:
        self._redis = redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_S,
                                           socket_connect_timeout=SOCKET_TIMEOUT_S)
        self._prefix, self.ttl_s = prefix, ttl_s

    def _key(self, process: str) -> str:
        return f"{self._prefix}:process:{process}"

    async def publish(self, process: str, contribution: dict, ended: list[dict]) -> None:
        """Write (and so keep alive) ``process``'s contribution; append its newly ended decisions."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._key(process), json.dumps(contribution), px=int(self.ttl_s * 1000))
        pipe.sadd(f"{self._prefix}:processes", process)
        if ended:
            pipe.rpush(f"{self._prefix}:decisions", *(json.dumps(record) for record in ended))
            pipe.ltrim(f"{self._prefix}:decisions", -DECISIONS_KEPT, -1)
        await asyncio.to_thread(pipe.execute)

    async def contributions(self) -> dict[str, dict]:
        """The contribution of every live process, by process id."""
        return await asyncio.to_thread(self._contributions)

    def _contributions(self) -> dict[str, dict]:
        ids = sorted(member.decode() for member in self._redis.smembers(f"{self._prefix}:processes"))
        if not ids:
            return {}
        values = self._redis.mget([self._key(process) for process in ids])
        if dead := [process for process, value in zip(ids, values, strict=True) if value is None]:
            self._redis.srem(f"{self._prefix}:processes", *dead)
        return {process: json.loads(value)
                for process, value in zip(ids, values, strict=True) if value is not None}

    async def decisions(self) -> list[dict]:
        """The ended decisions of every process, oldest first."""
        return await asyncio.to_thread(self.ended_decisions)

    def ended_decisions(self) -> list[dict]:
        """``decisions`` for a caller outside the event loop (a synchronous view)."""
        return [json.loads(record) for record in self._redis.lrange(f"{self._prefix}:decisions", 0, -1)]

    async def withdraw(self, process: str) -> None:
        """A process that closes stops counting at once, not after its time to live."""
        pipe = self._redis.pipeline(transaction=False)
        pipe.delete(self._key(process))
        pipe.srem(f"{self._prefix}:processes", process)
        await asyncio.to_thread(pipe.execute)

    async def close(self) -> None:
        await asyncio.to_thread(self._redis.close)
