"""One router view for every gateway process of an installation.

Each process's router books what it sends to a replica (routing/state.py), exact to the token, but
only its own share: two server processes behind a load balancer would each see half the load and
send a replica twice what either thinks it has. ``FleetView`` (one per gateway) shares the view:
every ``HEARTBEAT_S`` it publishes this process's contribution (per replica: requests in flight, not
yet prefilled, their tokens, the KV space reserved, each one's context and tokens left; the outcomes
of the error window; per model, the requests waiting for a replica) and reads every live process's
(fleet_store.py). The others' sum per replica becomes each ``ReplicaState.peers`` and their outcomes
the recorder's ``peer_outcomes``, so every decision weighs the load and errors of the whole fleet.

Routing never waits on Redis: it reads the others' figures of the last heartbeat (at most
``HEARTBEAT_S`` plus their own heartbeat old) plus this process's own bookkeeping, which is live, so
a burst inside one process is seen by it at once. A process that dies stops counting when its
contribution expires (``CONTRIBUTION_TTL_S``). Redis unreachable: each process routes on its own
view until it answers again (a warning in the log). Embedded default (no Redis): the view is the
one process's own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

from redis.exceptions import RedisError

from controlplane.gateway.routing import PeerLoad, ReplicaState
from controlplane.gateway.serving.decision_log import recorder
from controlplane.gateway.serving.fleet_store import (
    HEARTBEAT_S,
    FleetStore,
    installation_prefix,
    process_id,
    shared_url,
)

log = logging.getLogger(__name__)


def contribution(process: str, replicas: list[ReplicaState], waiting: dict[str, int]) -> dict:
    """This process's share of the view, as published (JSON)."""
    return {"process": process, "at": time.time(), "waiting": waiting,
            "replicas": {r.replica_id: {**asdict(r.own_load()), "outcomes": recorder.outcomes(r.replica_id)}
                         for r in replicas}}


def _load(figures: dict) -> PeerLoad:
    return PeerLoad(figures["in_flight"], figures["unstarted"], figures["queued_tokens"],
                    figures["kv_reserved"], tuple((context, left) for context, left in figures["running"]))


def peers_of(contributions: dict[str, dict],
             me: str) -> tuple[dict[str, PeerLoad], dict[str, tuple[int, int]]]:
    """The other processes' load and (requests, failed) outcomes, summed per replica."""
    loads: dict[str, PeerLoad] = {}
    outcomes: dict[str, tuple[int, int]] = {}
    for process, shared in contributions.items():
        if process == me:
            continue
        for replica, figures in shared["replicas"].items():
            loads[replica] = loads.get(replica, PeerLoad()) + _load(figures)
            n, failed = outcomes.get(replica, (0, 0))
            outcomes[replica] = (n + figures["outcomes"][0], failed + figures["outcomes"][1])
    return loads, outcomes


class FleetView:
    """The view of every live gateway process (``store`` None: this process's alone). ``process``:
    the id this process publishes under (``process_id()``)."""

    def __init__(self, store: FleetStore | None, *, process: str | None = None) -> None:
        self.store, self.process = store, process or process_id()
        self.contributions: dict[str, dict] = {}  # process id -> its contribution, as last read
        self.reachable = True  # whether the last heartbeat reached the store (a warning when it stops)

    @classmethod
    def connect(cls) -> FleetView:
        """Shared through Redis in service mode, this process's own in the embedded default."""
        return cls(FleetStore(url, prefix=installation_prefix()) if (url := shared_url()) else None)

    async def sync(self, replicas: list[ReplicaState], waiting: dict[str, int]) -> None:
        """One heartbeat: publish this process's contribution, read the others', apply their sums."""
        me, own = self.process, contribution(self.process, replicas, waiting)
        others: dict[str, dict] = {}
        if self.store is not None:
            ended = [asdict(recorder.ended.popleft()) for _ in range(len(recorder.ended))]
            try:
                await self.store.publish(me, own, ended)
                others = await self.store.contributions()
            except (RedisError, OSError) as exc:
                if self.reachable:
                    log.warning("the gateways' shared view is unreachable, routing on this one's: %s", exc)
                self.reachable = False
            else:
                if not self.reachable:
                    log.warning("the gateways' shared view is reachable again")
                self.reachable = True
        self.contributions = {**others, me: own}
        loads, outcomes = peers_of(self.contributions, me)
        for replica in replicas:
            replica.peers = loads.get(replica.replica_id, PeerLoad())
        recorder.peer_outcomes = outcomes

    def snapshot(self, replicas: list[ReplicaState], waiting: dict[str, int]) -> dict:
        """The fleet-wide view for the router API: each live process (this one as of now) and, per
        replica, the sum over them and each one's requests in flight."""
        me = self.process
        contributions = {**self.contributions, me: contribution(me, replicas, waiting)}
        now = time.time()
        processes = [{"process": process, "age_s": round(max(0.0, now - shared["at"]), 3),
                      "in_flight": sum(f["in_flight"] for f in shared["replicas"].values()),
                      "waiting": shared["waiting"]}
                     for process, shared in sorted(contributions.items())]
        totals: dict[str, dict] = {}
        for process, shared in contributions.items():
            for replica, figures in shared["replicas"].items():
                total = totals.setdefault(replica, {"in_flight": 0, "queued_tokens": 0, "running_tokens": 0,
                                                    "kv_reserved": 0, "by_process": {}})
                total["in_flight"] += figures["in_flight"]
                total["queued_tokens"] += figures["queued_tokens"]
                total["running_tokens"] += sum(left for _, left in figures["running"])
                total["kv_reserved"] += figures["kv_reserved"]
                total["by_process"][process] = figures["in_flight"]
        return {"shared": self.store is not None, "process": me, "heartbeat_s": HEARTBEAT_S,
                "ttl_s": self.store.ttl_s if self.store is not None else None,
                "processes": processes, "replicas": totals}

    async def decisions(self, own: list[dict], *, keep: int) -> list[dict]:
        """The last ``keep`` decisions of every process: this one's as of now (running ones included)
        and the others' that ended, oldest first."""
        records = {(r["process"], r["request_id"]): r for r in await self._published()}
        records.update({(r["process"], r["request_id"]): r for r in own})
        return sorted(records.values(), key=lambda r: r["at"])[-keep:]

    async def _published(self) -> list[dict]:
        if self.store is None:
            return []
        try:
            return await self.store.decisions()
        except (RedisError, OSError) as exc:
            log.warning("the gateways' shared decisions are unreachable: %s", exc)
            return []

    async def close(self) -> None:
        """Stop counting at once (not after the time to live) and close the connection."""
        if self.store is not None:
            try:
                await self.store.withdraw(self.process)
            except (RedisError, OSError) as exc:
                log.warning("could not withdraw from the gateways' shared view: %s", exc)
            await self.store.close()
