"""Placing a request on a replica: at once when the router can, else after a bounded wait.

``replica_admit`` asks the router; a request it cannot place, because no replica is routable (none
listed: the deployment is deploying or re-planning; or all unhealthy: the router's ``unavailable``) or
because every replica is busy (the router's ``saturated``: overload), joins its model's queue
(waiting.py) instead of failing, and is placed first come first served as soon as the router can
place it. A request that arrives while others of its model wait queues behind them. The queue is
bounded from the plan's capacity (shedding.py): a request that finds it full is shed at once, with
``429`` when healthy replicas are busy and ``503`` when none can serve, and a ``Retry-After`` that is
the queue's length over the model's recent completion rate. A resumed request (admitted before its
pipeline broke) goes to the front and is bounded only by ``MAX_WAITING``. The wait ends at ``WAIT_S``
or the request's own deadline, whichever comes first, with a 503 that says why no replica could take
it (the deployment's state, each replica's health reason) and the same computed ``Retry-After``. A
resumed request that a replica refused (its KV was full) leaves that replica out until the gateway
read its head's statistics again (two ``WAIT_POLL_S``), so the router sees the space it really has.

A model whose deployments cannot serve (failed, or a lost node with no plan that fits even degraded)
answers 503 with ``Retry-After`` at once, and ends the waits of its queued requests: nothing is
coming until the fleet or an operator changes something.

``model_unserved`` tells a model nobody deployed (503 at once: nothing is coming, no wait) from a
name the catalog does not know (404).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from django.conf import settings

from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.openai.errors import (
    OpenAIError,
    bad_request,
    model_not_deployed,
    model_not_found,
    saturated,
)
from controlplane.gateway.openai.errors import unavailable as unavailable_error
from controlplane.gateway.routing import Decision, Rejection, RequestShape
from controlplane.gateway.serving.runtime import ModelRoute, gateway
from controlplane.gateway.serving.shedding import planned_rate, queue_bound, retry_after_s
from controlplane.gateway.serving.waiting import ModelQueue
from controlplane.models_catalog.models import LlmModel


class Admitted(NamedTuple):
    """A request's place: its route, the router's decision, and how long it waited for one and why (the
    model's reason at the start of the wait: a handover, a re-plan, every replica busy; "" when it did
    not wait)."""

    route: ModelRoute
    decision: Decision
    waited_s: float
    waited_for: str = ""


class Refused(Exception):
    """The request cannot be placed: ``rejection`` for the router's records, ``error`` for the client."""

    def __init__(self, rejection: Rejection, error: OpenAIError, waited_s: float = 0.0) -> None:
        super().__init__(error.message)
        self.rejection, self.error, self.waited_s = rejection, error, waited_s


async def model_unserved(name: str) -> OpenAIError:
    """The error for a model the gateway does not serve: 503 if the catalog has it, else 404."""
    if await LlmModel.objects.filter(name=name).aexists():
        return model_not_deployed(name)
    return model_not_found(name)


def _too_large(rejection: Rejection) -> Refused:
    error = bad_request(rejection.message, param="max_tokens", code="context_length_exceeded")
    return Refused(rejection, error)


def _route(route: ModelRoute, shape: RequestShape, *, until: float,
           exclude: frozenset[str]) -> Decision | Rejection:
    return route.router.route(shape, deadline_s=max(until - time.monotonic(), 0.0), exclude=exclude)


async def _served(name: str) -> ModelRoute:
    """The model's route now; a model no longer served (its deployment stopped) ends the wait: nothing
    is coming. So does one whose deployments cannot serve (``ServedModel.cannot_serve``), with a
    ``Retry-After`` of the controller's next re-plan (``MOTLEY_RECONCILE_INTERVAL_S``: it plans again
    each pass, and serves, on a degraded plan if need be, as soon as one fits)."""
    if (route := await gateway().route(name)) is None:
        message = f"model {name!r} is no longer served: its deployment was stopped"
        raise Refused(Rejection("unavailable", message), unavailable_error(message))
    if route.served.cannot_serve:
        message = f"model {name!r} cannot be served now: {route.served.reason}"
        retry_after = max(1, math.ceil(settings.MOTLEY_RECONCILE_INTERVAL_S))
        error = unavailable_error(message, retry_after_s=retry_after)
        raise Refused(Rejection("unavailable", message), error)
    return route


def _why(route: ModelRoute, rejection: Rejection | None) -> str:
    parts = [route.served.reason, rejection.message if rejection else ""]
    return "; ".join(p for p in parts if p) or "no replica is routable"


def _retry_after(route: ModelRoute, queue: ModelQueue, shape: RequestShape) -> int:
    """When a request refused now may find a place: the queue over the model's completion rate."""
    per_s = queue.completions.per_s() or planned_rate(route.router.replicas, shape)
    return retry_after_s(len(queue) + 1, per_s, fallback_s=int(gateway_setting("RETRY_AFTER_S")))


def _shed(route: ModelRoute, queue: ModelQueue, shape: RequestShape, bound: int,
          outcome: Rejection | None) -> Refused:
    """The refusal of a request that found its model's queue full: 429 while healthy replicas are busy,
    503 when none can serve."""
    queue.refused_full()
    retry_after = _retry_after(route, queue, shape)
    busy = any(r.health.ok for r in route.router.replicas)
    message = (f"{len(queue)} requests of model {route.served.name!r} already wait for a replica (the "
               f"queue's bound, {bound}: {_why(route, outcome) if not busy else 'every replica is busy'}); "
               f"retry in {retry_after} s, when the queue ahead is estimated to have drained")
    if busy:
        return Refused(Rejection("saturated", message), saturated(message, retry_after_s=retry_after))
    return Refused(Rejection("unavailable", message), unavailable_error(message, retry_after_s=retry_after))


async def replica_admit(
    *, name: str, shape: RequestShape, deadline_at: float, resuming: bool = False,
    exclude: frozenset[str] = frozenset(),
) -> Admitted:
    """The route and the router's decision for the request, and how long it waited (s) and why; raises
    ``Refused``. ``deadline_at``: the request's own deadline (monotonic clock); ``resuming``: a request
    whose pipeline broke, placed before any new one; ``exclude``: replicas not to use (one that refused
    it)."""
    g = gateway()
    queue = g.waiting.queue(name)
    route = await _served(name)
    outcome = None
    if resuming or not len(queue):
        outcome = _route(route, shape, until=deadline_at, exclude=exclude)
        if isinstance(outcome, Decision):
            return Admitted(route, outcome, 0.0)
        if outcome.reason == "too_large":
            raise _too_large(outcome)
    most = int(gateway_setting("MAX_WAITING"))
    bound = most if resuming else queue_bound(route.router.replicas, shape, most=most)
    if len(queue) >= bound:
        raise _shed(route, queue, shape, bound, outcome)
    until = min(time.monotonic() + float(gateway_setting("WAIT_S")), deadline_at)
    waiter = queue.join(front=resuming)
    waited_for = _why(route, outcome) if outcome is not None else (
        route.served.reason or f"{len(queue) - 1} requests of model {name!r} waited before it")
    g.hurry()
    poll_s = float(gateway_setting("WAIT_POLL_S"))
    try:
        while True:
            if exclude and time.monotonic() - waiter.since > 2 * poll_s:
                exclude = frozenset()  # its head's statistics were read since: the router knows its KV
            if queue.first(waiter):
                route = await _served(name)
                outcome = _route(route, shape, until=deadline_at, exclude=exclude)
                if isinstance(outcome, Decision):
                    return Admitted(route, outcome, queue.leave(waiter, "admitted"), waited_for)
                if outcome.reason == "too_large":
                    refusal = _too_large(outcome)
                    refusal.waited_s = queue.leave(waiter, "refused")
                    raise refusal
            left = until - time.monotonic()
            if left <= 0:
                waited = queue.leave(waiter, "timed_out")
                message = (f"no replica of model {name!r} could take the request within {waited:.1f} s of "
                           f"waiting: {_why(route, outcome)}")
                error = unavailable_error(message, retry_after_s=_retry_after(route, queue, shape))
                raise Refused(Rejection("unavailable", message), error, waited)
            await queue.changed(min(poll_s, left))
    finally:
        queue.leave(waiter, "cancelled")  # a client that went away while waiting (no-op otherwise)
