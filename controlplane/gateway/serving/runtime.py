"""The gateway's live state: for each served model its tokenizer, router and pipeline clients.

One ``Gateway`` per event loop (the ASGI server runs one), since pipeline clients belong to the loop
that opened them. The served models are re-read from the directory every ``REFRESH_S`` seconds and
each replica's head is asked for its statistics at the same pace (free KV, queue, health, the
summary of the prompt prefixes it caches); the agents' telemetry is read every ``HEALTH_REFRESH_S``
(live_health.py: throttling, memory, stale agents, measured step times), all in the background, so
no request waits on telemetry.

A replica is routed to only once its head said it is healthy: a deployment is READY when each stage
process reported ready, but the stages connect to each other just after, and until then the head's
``health()`` (part of its stats) is not ok. A new replica is asked once before any request can be
routed to it; one that is not serving yet (or does not answer) stays out until a later background
poll finds it healthy; meanwhile requests wait for it (waiting.py, admission.py).

While any request waits, the served models and every head are re-read every ``WAIT_POLL_S`` instead
of ``REFRESH_S`` (a waiting request wakes the poller at once), the heads that have not said ok every
``WAIT_HEAD_POLL_S`` (a question to a head costs it microseconds; a re-read of the served models costs
the database), and each re-read wakes the waiters: a handover's pause lasts as long as the new
pipeline takes to answer, not a polling period more. A head that turns ok has the agents' telemetry
read again at once: its restarted or moved stages' samples (the telemetry must know them) are
otherwise taken in only within ``HEALTH_REFRESH_S``. In place, on two cores, the waiting requests go
0.03-0.08 s after the controller's "serving again", where polls every ``WAIT_POLL_S`` alone take
0.11-0.25 s (`benchmarks/replacement_bench.py --room in-place`).

Where several server processes serve, their routers share one view (fleet_view.py): a heartbeat
every ``HEARTBEAT_S`` publishes this process's load and reads the others'.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.db import DatabaseError
from django.utils.module_loading import import_string

from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.gateway.routing import ReplicaHealth, ReplicaState, Router
from controlplane.gateway.serving.decision_log import decision_stats
from controlplane.gateway.serving.directory import ReplicaEndpoint, ServedModel
from controlplane.gateway.serving.fleet_store import HEARTBEAT_S
from controlplane.gateway.serving.fleet_view import FleetView
from controlplane.gateway.serving.live_health import LiveHealth, stale_after_s, telemetry_view
from controlplane.gateway.serving.waiting import Waiting

log = logging.getLogger(__name__)


@dataclass
class ModelRoute:
    """Everything needed to serve one model."""

    served: ServedModel
    tokenizer: ModelTokenizer
    router: Router
    clients: dict[str, Any] = field(default_factory=dict)  # pipeline_id -> PipelineClient
    heads: dict[str, tuple[str, str]] = field(default_factory=dict)  # pipeline_id -> its client's head, token
    live: LiveHealth = field(default_factory=LiveHealth)  # the gateway's, shared by its routes

    def replica(self, pipeline_id: str) -> ReplicaState:
        return next(r for r in self.router.replicas if r.replica_id == pipeline_id)

    def endpoint(self, pipeline_id: str) -> ReplicaEndpoint:
        return next(e for e in self.served.replicas if e.pipeline_id == pipeline_id)

    def replica_failed(self, state: ReplicaState, reason: str) -> None:
        """A request found the pipeline broken: out of routing until its head answers ok again."""
        self.live.head_failed(state.replica_id, reason)
        self.live.apply(state, self.endpoint(state.replica_id))


class Gateway:
    def __init__(self) -> None:
        self.routes: dict[str, ModelRoute] = {}
        self._client_class = import_string(gateway_setting("CLIENT"))
        self._source = import_string(gateway_setting("SERVED_MODELS"))
        self._refreshed = float("-inf")
        self._polled_all = float("-inf")  # when every head was last asked (time.monotonic())
        self._lock = asyncio.Lock()
        self._pollers: list[asyncio.Task] = []
        self._polls: dict[str, asyncio.Task] = {}  # pipeline id -> its head's statistics call in flight
        self._asked: set[str] = set()  # pipeline ids whose head was asked for its stats at least once
        self.live = LiveHealth()
        self.waiting = Waiting()
        self.fleet = FleetView.connect()
        self._hurry = asyncio.Event()  # set by a request that starts to wait: poll now, then fast
        self._closing: set[asyncio.Task] = set()  # replaced clients waiting to be closed

    async def route(self, name: str) -> ModelRoute | None:
        await self._maybe_refresh()
        return self.routes.get(name)

    async def all_routes(self) -> list[ModelRoute]:
        await self._maybe_refresh()
        return list(self.routes.values())

    def hurry(self) -> None:
        """A request waits for a replica: re-read the served models and heads now and fast after."""
        self._hurry.set()

    def _refresh_s(self) -> float:
        return gateway_setting("WAIT_POLL_S" if self.waiting.active() else "REFRESH_S")

    def _poll_interval_s(self) -> float:
        return gateway_setting("WAIT_HEAD_POLL_S" if self.waiting.active() else "REFRESH_S")

    async def _maybe_refresh(self) -> None:
        if time.monotonic() - self._refreshed < self._refresh_s():
            return
        async with self._lock:
            if time.monotonic() - self._refreshed < self._refresh_s():
                return
            try:
                served = await sync_to_async(self._source, thread_sensitive=True)()
            except DatabaseError as exc:  # a restart, a failover: serve on what was read last
                if not self.routes:
                    raise
                log.warning("the served models could not be re-read, serving on the last read: %s", exc)
                self._refreshed = time.monotonic()
                return
            new = [self._sync(model) for model in served]
            routes = {route.served.name: route for route in new}
            for name in set(self.routes) - set(routes):  # a model no longer served at all
                for client in self.routes[name].clients.values():
                    self._close_soon(client)
            self.routes = routes
            served_ids = {r.replica_id for _, r in self._replicas()}
            self._asked &= served_ids
            self._polls = {pid: task for pid, task in self._polls.items() if pid in served_ids}
            self.live.forget(served_ids)
            self._refreshed = time.monotonic()
            await self._read_telemetry()
            await self._poll_new()
            if not self._pollers or any(task.done() for task in self._pollers):
                for task in self._pollers:
                    task.cancel()
                self._pollers = [asyncio.create_task(self._poll_forever()),
                                 asyncio.create_task(self._health_forever()),
                                 asyncio.create_task(self._fleet_forever())]

    def _sync(self, served: ServedModel) -> ModelRoute:
        """Carry the live state (in-flight bookkeeping, clients) of replicas that are still served;
        the clients of those no longer served are closed once their requests had time to end."""
        old = self.routes.get(served.name)
        tokenizer = ModelTokenizer.load(served.tokenizer_path)
        states = {r.replica_id: r for r in old.router.replicas} if old else {}
        clients = dict(old.clients) if old else {}
        heads = dict(old.heads) if old else {}
        replicas = []
        for endpoint in served.replicas:
            state = states.get(endpoint.pipeline_id)
            head = (endpoint.head_address, endpoint.auth_token)
            if state is not None and heads.get(endpoint.pipeline_id) != head:
                # Re-planned in place with its head moved (a lost node's stages elsewhere): the old
                # client would wait on the dead address for ever. A new replica to the router.
                self._close_soon(clients.pop(endpoint.pipeline_id))
                self._asked.discard(endpoint.pipeline_id)
                state = None
            if state is None:  # not routable until its head says the pipeline is serving
                state = ReplicaState(
                    endpoint.pipeline_id, endpoint.costs, endpoint.kv_tokens or 0,
                    ReplicaHealth(ok=False, reason="its head has not answered yet"),
                    costs_source=endpoint.costs_source,
                )
                clients[endpoint.pipeline_id] = self._client_class(
                    endpoint.head_address, endpoint.auth_token, endpoint.pipeline_id,
                    timeout_s=gateway_setting("CLIENT_TIMEOUT_S"),
                )
                heads[endpoint.pipeline_id] = head
            if endpoint.kv_tokens:
                state.kv_capacity = endpoint.kv_tokens
            self.live.apply(state, endpoint)
            replicas.append(state)
        for gone in set(clients) - {e.pipeline_id for e in served.replicas}:
            self._close_soon(clients.pop(gone))  # stopped (replaced beside, scaled in): its requests end
            heads.pop(gone, None)
        if old and old.router.strategy == served.strategy:
            router = old.router
            router.replicas = replicas
        else:
            router = Router(replicas, served.strategy)
        return ModelRoute(served, tokenizer, router, clients, heads, self.live)

    def _close_soon(self, client: Any) -> None:
        """Close a replaced or retired client once the requests it still carries have ended (they
        finish, or fail against a dead head within the client's timeout and migrate)."""
        async def close_later() -> None:
            try:
                await asyncio.sleep(2 * gateway_setting("CLIENT_TIMEOUT_S"))
            finally:  # also when the gateway closes first
                await client.close()

        self._closing.add(task := asyncio.get_running_loop().create_task(close_later()))
        task.add_done_callback(self._closing.discard)

    async def _poll_new(self) -> None:
        """A replica never heard from is asked (health, KV budget) before it is routed to."""
        await asyncio.gather(*(
            self._poll(route, r) for route, r in self._replicas() if r.replica_id not in self._asked
        ))

    def _replicas(self) -> list[tuple[ModelRoute, ReplicaState]]:
        return [(route, r) for route in self.routes.values() for r in route.router.replicas]

    async def _poll_forever(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self._poll_interval_s()):
                    await self._hurry.wait()
            except TimeoutError:
                pass
            hurried = self._hurry.is_set()
            self._hurry.clear()
            every = hurried or time.monotonic() - self._polled_all >= self._refresh_s()
            try:
                await self._maybe_refresh()
                self._poll_all(unready_only=not every)
            except Exception:  # a failed refresh (e.g. the database) must not stop telemetry for good
                log.exception("refreshing the served models failed")
            if every:
                self._polled_all = time.monotonic()
                self.waiting.notify_all()

    def _poll_all(self, *, unready_only: bool = False) -> None:
        """Ask every head (``unready_only``: those that have not said ok), each in its own task: a dead
        head, silent until ``CLIENT_TIMEOUT_S``, must not hold back the answers of the others (a
        waiting request needs the new pipeline's at once)."""
        for route, state in self._replicas():
            if unready_only and self.live.head_ok(state.replica_id):
                continue
            task = self._polls.get(state.replica_id)
            if task is None or task.done():
                self._polls[state.replica_id] = asyncio.create_task(self._poll(route, state))

    async def _health_forever(self) -> None:
        """The agents' telemetry, applied to every replica (a sample reaches the router within this)."""
        while True:
            await asyncio.sleep(gateway_setting("HEALTH_REFRESH_S"))
            try:
                await self._read_telemetry()
                for route, state in self._replicas():
                    self.live.apply(state, route.endpoint(state.replica_id))
            except Exception:
                log.exception("reading the telemetry failed")

    async def _fleet_forever(self) -> None:
        """The heartbeat of this process's share of the router view (fleet_view.py)."""
        while True:
            try:
                await self.fleet.sync(*self.fleet_inputs())
            except Exception:
                log.exception("sharing the router view failed")
            await asyncio.sleep(HEARTBEAT_S)

    def fleet_inputs(self) -> tuple[list[ReplicaState], dict[str, int]]:
        """What this process contributes to the shared view: its replicas and waiting requests."""
        return ([r for _, r in self._replicas()],
                {name: len(queue) for name, queue in self.waiting.queues.items() if len(queue)})

    async def _read_telemetry(self) -> None:
        """The agents' latest samples; none when they cannot be read (every replica that expects
        them is then unhealthy: routing blind is not an option)."""
        if self.live.enabled() and any(route.endpoint(r.replica_id).stages for route, r in self._replicas()):
            try:
                self.live.telemetry = await sync_to_async(telemetry_view, thread_sensitive=False)()
            except Exception:
                log.exception("reading the agents' telemetry failed")
                self.live.telemetry = None

    async def _poll(self, route: ModelRoute, state: ReplicaState) -> None:
        """One statistics call to the head: its health, free KV per stage, queue, largest request and
        prefix summary."""
        self._asked.add(state.replica_id)
        try:
            stats = await route.clients[state.replica_id].stats()
        except Exception as exc:  # any failure to answer makes the replica unroutable until it answers
            log.warning("replica %s did not answer stats: %s", state.replica_id, exc)
            self.live.head_failed(state.replica_id, f"its head did not answer: {exc}")
        else:
            if not state.kv_capacity and stats.get("max_request_tokens"):
                state.kv_capacity = int(stats["max_request_tokens"])
            turned_ok = bool(stats.get("ok")) and not self.live.head_ok(state.replica_id)
            self.live.head_answered(state.replica_id, stats)
            if turned_ok:  # its new stages' samples, now rather than within HEALTH_REFRESH_S
                await self._read_telemetry()
        self.live.apply(state, route.endpoint(state.replica_id), head_answer=True)
        for other in route.router.replicas:  # the replica it takes over from serves on until it is ok
            if route.endpoint(other.replica_id).successor == state.replica_id:
                self.live.apply(other, route.endpoint(other.replica_id))
        self.waiting.notify_all()

    async def close(self) -> None:
        for task in [*self._pollers, *self._polls.values(), *self._closing]:
            task.cancel()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for route in self.routes.values():
            for client in route.clients.values():
                await client.close()
        await self.fleet.close()


_gateways: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gateway] = weakref.WeakKeyDictionary()


def gateway() -> Gateway:
    loop = asyncio.get_running_loop()
    if loop not in _gateways:
        _gateways[loop] = Gateway()
    return _gateways[loop]


async def gateway_stats() -> dict:
    """Per model and replica, everything the router uses now (its bookkeeping, health and why, costs
    and their source, the telemetry and head statistics it read, with their ages) and the head's last
    statistics (contracts §2, as polled every ``REFRESH_S``), plus the recent decisions with the
    inputs of each and the process that decided, and the load of every live gateway process
    (``fleet``): the router statistics of ``GET /api/v1/gateway/router/`` and the dashboard."""
    g = gateway()
    models = {}
    for route in await g.all_routes():
        replicas = {}
        for state in route.router.replicas:
            endpoint = route.endpoint(state.replica_id)
            head = g.live.heads.get(state.replica_id)
            replicas[state.replica_id] = {
                "pipeline": head.shown_stats if head is not None else {},
                "router": g.live.describe(state, endpoint),
                "stages": [{"stage_key": s.stage_key, "device": s.device} for s in endpoint.stages],
            }
        models[route.served.name] = {"strategy": route.router.strategy, "replicas": replicas,
                                     "reason": route.served.reason,
                                     "waiting": g.waiting.snapshot(route.served.name)}
    settings = {"refresh_s": gateway_setting("REFRESH_S"),
                "health_refresh_s": gateway_setting("HEALTH_REFRESH_S"),
                "telemetry_stale_s": stale_after_s(), "live_telemetry": g.live.enabled(),
                **{name.lower(): gateway_setting(name)
                   for name in ("WAIT_S", "MAX_WAITING", "WAIT_POLL_S", "MAX_MIGRATIONS")}}
    decisions = decision_stats()
    decisions["recent"] = await g.fleet.decisions(decisions["recent"], keep=len(decisions["recent"]) or 50)
    return {"at": time.time(), "settings": settings, "models": models, "router": decisions,
            "fleet": g.fleet.snapshot(*g.fleet_inputs())}
