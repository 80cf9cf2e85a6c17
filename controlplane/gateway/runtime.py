"""The gateway's live state: for each served model its tokenizer, router and pipeline clients.

One ``Gateway`` per event loop (the ASGI server runs one), since pipeline clients belong to the loop
that opened them. The served models are re-read from the directory every ``REFRESH_S`` seconds and
each replica's head is asked for its statistics at the same pace (free KV, health), in the
background, so no request waits on telemetry.

A replica is routed to only once its head said it is healthy: a deployment is READY when each stage
process reported ready, but the stages connect to each other just after, and until then the head's
``health()`` (part of its stats) is not ok. A new replica is asked once before any request can be
routed to it; one that is not serving yet (or does not answer) stays out, 503 when no replica is
left, until a later background poll finds it healthy.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass, field, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.utils.module_loading import import_string

from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.directory import ServedModel
from controlplane.gateway.routing import ReplicaHealth, ReplicaState, Router
from controlplane.gateway.telemetry import router_telemetry
from controlplane.gateway.tokenization import ModelTokenizer

log = logging.getLogger(__name__)


@dataclass
class ModelRoute:
    """Everything needed to serve one model."""

    served: ServedModel
    tokenizer: ModelTokenizer
    router: Router
    clients: dict[str, Any] = field(default_factory=dict)  # pipeline_id -> PipelineClient
    health: dict[str, ReplicaHealth] = field(default_factory=dict)  # from the directory

    def replica(self, pipeline_id: str) -> ReplicaState:
        return next(r for r in self.router.replicas if r.replica_id == pipeline_id)


class Gateway:
    def __init__(self) -> None:
        self.routes: dict[str, ModelRoute] = {}
        self._client_class = import_string(gateway_setting("CLIENT"))
        self._source = import_string(gateway_setting("SERVED_MODELS"))
        self._refreshed = float("-inf")
        self._lock = asyncio.Lock()
        self._poller: asyncio.Task | None = None
        self._asked: set[str] = set()  # pipeline ids whose head was asked for its stats at least once

    async def route(self, name: str) -> ModelRoute | None:
        await self._maybe_refresh()
        return self.routes.get(name)

    async def all_routes(self) -> list[ModelRoute]:
        await self._maybe_refresh()
        return list(self.routes.values())

    async def _maybe_refresh(self) -> None:
        if time.monotonic() - self._refreshed < gateway_setting("REFRESH_S"):
            return
        async with self._lock:
            if time.monotonic() - self._refreshed < gateway_setting("REFRESH_S"):
                return
            served = await sync_to_async(self._source, thread_sensitive=True)()
            new = [self._sync(model) for model in served]
            self.routes = {route.served.name: route for route in new}
            self._asked &= {r.replica_id for _, r in self._replicas()}
            self._refreshed = time.monotonic()
            await self._poll_new()
            if self._poller is None or self._poller.done():
                self._poller = asyncio.create_task(self._poll_forever())

    def _sync(self, served: ServedModel) -> ModelRoute:
        """Carry the live state (in-flight bookkeeping, clients) of replicas that are still served."""
        old = self.routes.get(served.name)
        tokenizer = ModelTokenizer.load(served.tokenizer_path)
        states = {r.replica_id: r for r in old.router.replicas} if old else {}
        clients = dict(old.clients) if old else {}
        replicas = []
        for endpoint in served.replicas:
            state = states.get(endpoint.pipeline_id)
            if state is None:  # not routable until its head says the pipeline is serving
                state = ReplicaState(
                    endpoint.pipeline_id, endpoint.costs, endpoint.kv_tokens or 0,
                    replace(endpoint.health, ok=False),
                )
                clients[endpoint.pipeline_id] = self._client_class(
                    endpoint.head_address, endpoint.auth_token, endpoint.pipeline_id,
                    timeout_s=gateway_setting("CLIENT_TIMEOUT_S"),
                )
            state.costs = endpoint.costs
            if endpoint.kv_tokens:
                state.kv_capacity = endpoint.kv_tokens
            replicas.append(state)
        if old and old.router.strategy == served.strategy:
            router = old.router
            router.replicas = replicas
        else:
            router = Router(replicas, served.strategy)
        health = {e.pipeline_id: e.health for e in served.replicas}
        return ModelRoute(served, tokenizer, router, clients, health)

    async def _poll_new(self) -> None:
        """A replica never heard from is asked (health, KV budget) before it is routed to."""
        await asyncio.gather(*(
            self._poll(route, r) for route, r in self._replicas() if r.replica_id not in self._asked
        ))

    def _replicas(self) -> list[tuple[ModelRoute, ReplicaState]]:
        return [(route, r) for route in self.routes.values() for r in route.router.replicas]

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(gateway_setting("REFRESH_S"))
            try:
                await self._maybe_refresh()
                await asyncio.gather(*(self._poll(route, r) for route, r in self._replicas()))
            except Exception:  # a failed refresh (e.g. the database) must not stop telemetry for good
                log.exception("refreshing the served models failed")

    async def _poll(self, route: ModelRoute, state: ReplicaState) -> None:
        """One statistics call to the head: its health, free KV per stage and largest request."""
        directory_health = route.health.get(state.replica_id, ReplicaHealth())
        self._asked.add(state.replica_id)
        try:
            stats = await route.clients[state.replica_id].stats()
        except Exception as exc:  # any failure to answer makes the replica unroutable until it answers
            log.warning("replica %s did not answer stats: %s", state.replica_id, exc)
            state.observe(health=ReplicaHealth(ok=False))
            return
        if not state.kv_capacity and stats.get("max_request_tokens"):
            state.kv_capacity = int(stats["max_request_tokens"])
        free = stats.get("kv_tokens_free_by_stage") or {}
        state.observe(
            health=ReplicaHealth(
                ok=bool(stats.get("ok")) and directory_health.ok,
                throttle=directory_health.throttle,
                memory_pressure=directory_health.memory_pressure,
                error_rate=directory_health.error_rate,
            ),
            kv_tokens_free=min(free.values()) if free else None,
        )

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for route in self.routes.values():
            for client in route.clients.values():
                await client.close()


_gateways: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gateway] = weakref.WeakKeyDictionary()


def gateway() -> Gateway:
    loop = asyncio.get_running_loop()
    if loop not in _gateways:
        _gateways[loop] = Gateway()
    return _gateways[loop]


async def gateway_stats() -> dict:
    """Each replica's head statistics (contracts §2) with the router's view of it, plus the router's
    decisions and queue times: the ``stats`` the dashboard shows for the gateway."""
    models = {}
    for route in await gateway().all_routes():
        replicas = {}
        for state in route.router.replicas:
            try:
                pipeline = await route.clients[state.replica_id].stats()
            except Exception as exc:  # reported, not raised: stats must not fail because a replica did
                pipeline = {"error": str(exc)}
            replicas[state.replica_id] = {
                "pipeline": pipeline,
                "router": {
                    "in_flight": state.in_flight,
                    "queued_tokens": state.queued_tokens,
                    "running_tokens": state.running_tokens,
                    "kv_free": state.kv_free,
                    "kv_capacity": state.kv_capacity,
                    "healthy": state.health.ok,
                    "slowdown": state.health.slowdown,
                },
            }
        models[route.served.name] = {"strategy": route.router.strategy, "replicas": replicas}
    return {"models": models, "router": router_telemetry()}
