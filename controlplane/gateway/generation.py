"""One request from admission to its last text delta: route, submit, detokenize, stop, account.

``generation_start`` decides at once (400/429/503 before anything runs); ``Generation.deltas()``
then streams text. Whatever ends the stream (finish, stop string, deadline, error, a client that
went away and cancelled the task) closes the pipeline stream, which cancels the request on the
pipeline and frees its KV space, and releases its booking on the router.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict, dataclass

from controlplane.gateway.errors import OpenAIError, bad_request, deadline_exceeded, saturated, unavailable
from controlplane.gateway.protocol import GenerationRequest
from controlplane.gateway.routing import Decision, RequestShape
from controlplane.gateway.runtime import ModelRoute
from controlplane.gateway.telemetry import RouteRecord, recorder
from controlplane.gateway.textstream import IncrementalDetokenizer, StopStrings
from worker_runtime.errors import DeadlineExceeded, PipelineBroken, PipelineError, RequestRejected
from worker_runtime.sampling import SamplingParams


@dataclass(frozen=True)
class Delta:
    text: str
    finish_reason: str | None  # set on the last delta: "stop" | "length"


def generation_start(
    *,
    route: ModelRoute,
    request: GenerationRequest,
    prompt_ids: list[int],
    max_tokens: int,
    deadline_s: float,
) -> Generation:
    """Admit the request on a replica or raise the OpenAIError that refuses it."""
    shape = RequestShape(len(prompt_ids), max_tokens)
    request_id = uuid.uuid4().hex
    outcome = route.router.route(shape, deadline_s=deadline_s)
    record = RouteRecord(
        request_id, route.served.name, route.router.strategy, time.time(), None, "",
        prompt_tokens=shape.prompt_tokens, inputs=[asdict(i) for i in outcome.inputs],
    )
    if not isinstance(outcome, Decision):
        record.outcome = f"rejected:{outcome.reason}"
        recorder.record(record)
        if outcome.reason == "too_large":
            raise bad_request(outcome.message, param="max_tokens", code="context_length_exceeded")
        raise (saturated if outcome.reason == "saturated" else unavailable)(outcome.message)
    outcome.replica.start(request_id, shape)
    record.replica, record.outcome = outcome.replica.replica_id, "running"
    record.estimated_ttft_s, record.estimated_finish_s = outcome.estimated_ttft_s, outcome.estimated_finish_s
    recorder.record(record)
    return Generation(route, outcome, request_id, request, prompt_ids, max_tokens, deadline_s)


class Generation:
    def __init__(
        self,
        route: ModelRoute,
        decision: Decision,
        request_id: str,
        request: GenerationRequest,
        prompt_ids: list[int],
        max_tokens: int,
        deadline_s: float,
    ) -> None:
        self.route, self.decision, self.request_id, self.request = route, decision, request_id, request
        self.prompt_ids, self.max_tokens, self.deadline_s = prompt_ids, max_tokens, deadline_s
        self.completion_tokens = 0

    async def deltas(self) -> AsyncIterator[Delta]:
        """Text as it becomes final; empty deltas are never yielded, except a last one with its reason."""
        replica = self.decision.replica
        client = self.route.clients[replica.replica_id]
        tokenizer = self.route.tokenizer
        detokenizer, stops = IncrementalDetokenizer(tokenizer.tokenizer), StopStrings(self.request.stop)
        started = time.monotonic()
        outcome = "cancelled"
        request = self.request
        params = SamplingParams(temperature=request.temperature, top_p=request.top_p, seed=request.seed)
        events = client.submit(
            self.prompt_ids, params, max_tokens=self.max_tokens, stop_token_ids=tokenizer.eos_token_ids,
            request_id=self.request_id, deadline_s=self.deadline_s,
        )
        try:
            async with aclosing(events):
                while True:
                    remaining = self.deadline_s - (time.monotonic() - started)
                    try:
                        event = await asyncio.wait_for(anext(events), max(remaining, 0.0))
                    except TimeoutError:
                        raise DeadlineExceeded("the gateway's deadline passed") from None
                    except StopAsyncIteration:  # cancelled on the pipeline's side (e.g. by an operator)
                        return
                    if self.completion_tokens == 0:
                        recorder.first_token(self.request_id, time.monotonic() - started)
                    self.completion_tokens += 1
                    replica.token(self.request_id)
                    text, stopped = stops.push(detokenizer.push(event.token_id))
                    if event.finish_reason is not None and not stopped:
                        tail, stopped = stops.push(detokenizer.flush())
                        text += tail if stopped else tail + stops.flush()
                    if stopped or event.finish_reason is not None:
                        outcome = "completed"
                        yield Delta(text, "stop" if stopped else event.finish_reason)
                        return
                    if text:
                        yield Delta(text, None)
        except PipelineError as exc:
            outcome = f"failed:{exc.kind}"
            raise self._error(exc) from exc
        finally:
            replica.finish(self.request_id)
            recorder.finished(self.request_id, outcome, time.monotonic() - started, self.completion_tokens)

    def _error(self, exc: PipelineError) -> OpenAIError:
        if isinstance(exc, DeadlineExceeded):
            return deadline_exceeded(self.deadline_s)
        if isinstance(exc, RequestRejected):
            return saturated(f"the replica refused the request: {exc}")
        if isinstance(exc, PipelineBroken):
            # Unroutable until the next statistics poll finds it answering again.
            self.route.replica_failed(self.decision.replica, f"a request found the pipeline broken: {exc}")
        return unavailable(f"the replica failed: {exc}")
