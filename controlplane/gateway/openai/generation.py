"""One sequence from admission to its last text delta: place, submit, detokenize, stop, migrate, account.

``Generation.place()`` puts the sequence on a replica (admission.py: at once, or after a bounded wait
for a routable replica) or raises the OpenAIError that refuses it (400/429/503) before anything runs;
``place_beside`` puts a later sample of the same prompt on the replica of the first (samples.py, which
makes one Generation per sample of a request); ``Generation.deltas()`` then streams text. Whatever
ends the stream (finish, stop string, deadline, error, a client that went away and cancelled the task)
closes the pipeline stream, which cancels the request on the pipeline and frees its KV space, and
releases its booking on the router.

**Migration.** When the pipeline breaks under a request (``PipelineBroken``: a stage died, the head
is draining or went silent; or the stream ended without a finish reason) or a replica refuses its
resumption (``RequestRejected``: KV full), the request is resumed on a routable replica, waiting for
one as a new request would: the prompt plus the tokens generated so far is submitted with the same
request id, sampling parameters and seed, and ``max_tokens`` less what was generated. The worker's
sampler seeds each position by (seed, position) (worker_runtime/sampling.py), so a seeded or greedy
request continues exactly as it would have without the break; the detokenizer and stop strings keep
their state, so the client's stream simply continues (same response id, no text twice or missing,
``usage`` counting the real output). The router's booking moves with it. At most ``MAX_MIGRATIONS``
resumptions, then a 503 (a streamed response: its error event).

**Structured outputs.** A constrained request resumed elsewhere tells the head how many of its
prompt's last tokens are its output so far (``StructuredConstraint.generated``): the sampler's matcher
replays them before it masks the next token.

**Log-probabilities.** A request that asks gets each token's with it (``Delta.events``); with ``echo``
the prompt's come with the first token (``prompt_logprobs``), so a request resumed after its first
token does not ask for them again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict, dataclass, replace
from functools import partial

from contracts.logprobs import TokenLogprob
from contracts.pipeline_errors import DeadlineExceeded, PipelineBroken, PipelineError, RequestRejected
from contracts.sampling import SamplingParams
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.demand import demand_publish, demand_publish_due
from controlplane.gateway.openai.errors import OpenAIError, deadline_exceeded, saturated, unavailable
from controlplane.gateway.openai.protocol import GenerationRequest
from controlplane.gateway.openai.request_span import UNTRACED, RequestSpan
from controlplane.gateway.openai.textstream import IncrementalDetokenizer, StopStrings
from controlplane.gateway.routing import Decision, PromptPrefix, RequestShape
from controlplane.gateway.serving.admission import Refused, replica_admit
from controlplane.gateway.serving.decision_log import RouteRecord, recorder
from controlplane.gateway.serving.pipeline_client import TokenEvent
from controlplane.gateway.serving.runtime import ModelRoute, gateway


@dataclass(frozen=True)
class Delta:
    text: str
    finish_reason: str | None  # set on the last delta: "stop" | "length"
    # with log-probabilities asked: the tokens received since the last delta, whose text it ends
    events: tuple[TokenEvent, ...] = ()
    index: int = 0  # the choice (the sample, samples.py) it belongs to


class Generation:
    def __init__(
        self,
        route: ModelRoute,
        request_id: str,
        request: GenerationRequest,
        prompt_ids: list[int],
        max_tokens: int,
        deadline_s: float,
        span: RequestSpan = UNTRACED,
    ) -> None:
        self.route, self.request_id, self.request, self.span = route, request_id, request, span
        self.prompt_ids, self.max_tokens, self.deadline_s = prompt_ids, max_tokens, deadline_s
        self.started = time.monotonic()  # the deadline counts from here, waits included
        self.placed = self.started  # first placed on a replica: its queue time and e2e count from here
        self.generated: list[int] = []  # every token the client's output is made of, across replicas
        self.migrations = 0
        self.decision: Decision | None = None
        # echo with logprobs: the prompt's, from its second token, once its first token came
        self.prompt_logprobs: tuple[TokenLogprob, ...] | None = None
        # set at the first token: the head ran the prompt's prefill and named its full blocks
        self.prefilled = asyncio.Event()

    @property
    def completion_tokens(self) -> int:
        return len(self.generated)

    def _left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.started)

    def _shape(self) -> RequestShape:
        """What is left to do: the prompt and the tokens so far to prefill (the heads may cache a prefix of
        them), the rest to decode."""
        prompt = self.prompt_ids + self.generated
        return RequestShape(len(prompt), self.max_tokens - len(self.generated), PromptPrefix(prompt))

    async def place(self, *, exclude: frozenset[str] = frozenset()) -> None:
        """Book the request on a replica (at start, or resumed after a break) or raise the OpenAIError."""
        name, shape, resuming = self.route.served.name, self._shape(), self.decision is not None
        try:
            with self.span.child("gateway.route", **{"motley.prompt_tokens": shape.prompt_tokens}) as span:
                route, decision, waited_s, waited_for = await replica_admit(
                    name=name, shape=shape, deadline_at=self.started + self.deadline_s, resuming=resuming,
                    exclude=exclude,
                )
                self.span.routed(span, decision, waited_s, resuming)
                if waited_s > 0:
                    self.span.paused(waited_s, waited_for)
        except Refused as refused:
            if not resuming:
                recorder.record(RouteRecord(
                    self.request_id, name, self.route.router.strategy, time.time(), None,
                    f"rejected:{refused.rejection.reason}", prompt_tokens=len(self.prompt_ids),
                    inputs=[asdict(i) for i in refused.rejection.inputs], waited_s=round(refused.waited_s, 3),
                ))
            raise refused.error from None
        decision.replica.start(self.request_id, shape)
        self.route, self.decision = route, decision
        if resuming:
            return
        self.placed = time.monotonic()
        recorder.record(RouteRecord(
            self.request_id, name, route.router.strategy, time.time(), decision.replica.replica_id, "running",
            estimated_ttft_s=decision.estimated_ttft_s, estimated_finish_s=decision.estimated_finish_s,
            prompt_tokens=shape.prompt_tokens, cached_tokens=decision.cached_tokens,
            inputs=[asdict(i) for i in decision.inputs],
            waited_s=round(waited_s, 3),
        ))

    def place_beside(self, other: Generation) -> None:
        """Book the request on ``other``'s replica, past the router (samples.py: a later sample of the
        same prompt, whose full blocks that replica's prefix cache holds)."""
        self.route, self.decision = other.route, other.decision
        self.decision.replica.start(self.request_id, self._shape())
        self.placed = time.monotonic()

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text as it becomes final; empty deltas are never yielded, except a last one with its reason."""
        tokenizer = self.route.tokenizer
        detokenizer = IncrementalDetokenizer(tokenizer.tokenizer, keep=self.request.keep_token_ids)
        stops = StopStrings(self.request.stop)
        request = self.request
        params = SamplingParams(temperature=request.temperature, top_p=request.top_p, seed=request.seed,
                                logprobs=request.logprobs, constraint=request.constraint)
        scoring = request.echo and request.logprobs is not None
        pending: list[TokenEvent] = []
        outcome = "cancelled"
        try:
            while True:
                replica = self.decision.replica
                asked = params
                if scoring and not self.generated:  # a resumed request's prompt has its output too
                    asked = replace(params, prompt_logprobs=request.logprobs)
                if request.constraint is not None and self.generated:  # its matcher replays them
                    resumed = replace(request.constraint, generated=len(self.generated))
                    asked = replace(params, constraint=resumed)
                events = self.route.clients[replica.replica_id].submit(
                    self.prompt_ids + self.generated, asked,
                    max_tokens=self.max_tokens - len(self.generated),
                    stop_token_ids=tokenizer.eos_token_ids, request_id=self.request_id,
                    deadline_s=max(self._left(), 0.001), speculate=request.speculate,
                    traceparent=self.span.traceparent,
                )
                try:
                    async with aclosing(events):
                        while True:
                            try:  # not wait_for: on 3.11 it drops a client's cancel that meets a token
                                async with asyncio.timeout(max(self._left(), 0.0)):
                                    event = await anext(events)
                            except TimeoutError:
                                raise DeadlineExceeded("the gateway's deadline passed") from None
                            except StopAsyncIteration:  # cancelled on the pipeline's side (a handover)
                                raise PipelineBroken("the pipeline ended the stream "
                                                     "without a finish reason") from None
                            if not self.generated:
                                self.prefilled.set()
                                recorder.first_token(self.request_id, time.monotonic() - self.placed)
                                self.span.first_token(time.monotonic() - self.started)
                                if asked.prompt_logprobs is not None and event.logprobs is not None:
                                    self.prompt_logprobs = event.logprobs.prompt or ()
                            if request.logprobs is not None:
                                pending.append(event)
                            self.generated.append(event.token_id)
                            replica.token(self.request_id)
                            text, stopped = stops.push(detokenizer.push(event.token_id))
                            if event.finish_reason is not None and not stopped:
                                tail, stopped = stops.push(detokenizer.flush())
                                text += tail if stopped else tail + stops.flush()
                            if stopped or event.finish_reason is not None:
                                outcome = "completed"
                                yield Delta(text, "stop" if stopped else event.finish_reason, tuple(pending))
                                return
                            if text:
                                yield Delta(text, None, tuple(pending))
                                pending.clear()
                except (PipelineBroken, RequestRejected) as exc:
                    if isinstance(exc, RequestRejected) and not self.migrations:
                        raise  # refused at its first submission (head queue full, invalid): the client's 429
                    outcome = f"failed:{exc.kind}"
                    await self._migrate(exc)
                    outcome = "cancelled"
        except PipelineError as exc:
            outcome = f"failed:{exc.kind}"
            raise self._error(exc) from exc
        finally:
            self.decision.replica.finish(self.request_id)
            gateway().waiting.queue(self.route.served.name).ended()
            recorder.finished(self.request_id, outcome, time.monotonic() - self.placed,
                              self.completion_tokens)
            if demand_publish_due(now := time.time()):  # off the loop: it writes the shared cache
                waiting = {model: len(queue) for model, queue in gateway().waiting.queues.items()}
                publish = partial(demand_publish, now=now, waiting=waiting)
                asyncio.get_running_loop().run_in_executor(None, publish)
            self.span.end(outcome, self.completion_tokens)

    async def _migrate(self, exc: PipelineBroken | RequestRejected) -> None:
        """Resume the request on another replica (or this one once it serves again), or raise the 503."""
        old = self.decision.replica
        if isinstance(exc, PipelineBroken):  # unroutable until the next statistics poll finds it answering
            self.route.replica_failed(old, f"a request found the pipeline broken: {exc}")
        old.finish(self.request_id)
        limit = int(gateway_setting("MAX_MIGRATIONS"))
        if self.migrations >= limit:
            raise unavailable(
                f"the request's replica failed ({exc}) after it had already been resumed {self.migrations} "
                f"times, the most allowed (MAX_MIGRATIONS); {len(self.generated)} tokens were generated"
            ) from exc
        self.migrations += 1
        started = time.monotonic()
        await self.place(
            exclude=frozenset({old.replica_id}) if isinstance(exc, RequestRejected) else frozenset())
        self.span.migrated(exc.kind)
        recorder.migrated(self.request_id, to=self.decision.replica.replica_id, kind=exc.kind,
                          waited_s=round(time.monotonic() - started, 3))

    def _error(self, exc: PipelineError) -> OpenAIError:
        if isinstance(exc, DeadlineExceeded):
            return deadline_exceeded(self.deadline_s)
        if isinstance(exc, RequestRejected):
            return saturated(f"the replica refused the request: {exc}")
        return unavailable(f"the replica failed: {exc}")
