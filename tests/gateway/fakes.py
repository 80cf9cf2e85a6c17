"""A stand-in pipeline client (contracts §2) for the view tests: scripted tokens, errors and delays,
recording what it was asked and when (``at``, ``first_token_at``: monotonic), so the gateway's own
logic is tested without stage processes.

A script's ``tokens`` are the output of an uninterrupted run: a resumed request (its prompt ends with
the first k of them) gets the rest, as a seeded pipeline would; ``break_after`` breaks the pipeline
under the n-th submission to the replica after that many tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from contracts.logprobs import TokenLogprob, TokenLogprobs
from contracts.pipeline_errors import PipelineBroken
from contracts.prefix_cache import PrefixSummary
from contracts.sampling import SamplingParams
from controlplane.gateway.routing import ReplicaHealth, StageLink
from controlplane.gateway.serving.directory import ReplicaEndpoint, ServedModel
from controlplane.gateway.serving.pipeline_client import TokenEvent


@dataclass
class Script:
    tokens: list[int] = field(default_factory=list)  # emitted in order, then "length"
    delay_s: float = 0.0
    error: Exception | None = None
    kv_tokens: int = 4096
    planned_kv_tokens: int | None = None  # the directory's figure (the plan's), as the controller gives it
    healthy: bool = True  # the head's health()["ok"]: False until every stage joined the pipeline
    stages: tuple[StageLink, ...] = ()  # where its stages run (the gateway then reads their telemetry)
    queue_depth: int = 0  # the head's queue, as its statistics report it
    # n-th submission: PipelineBroken after so many tokens
    break_after: list[int] = field(default_factory=list)
    successor: str | None = None  # handed over beside to this replica (the directory states it unhealthy)
    # what its statistics report as "prefix_cache": a summary (sent as its JSON), None, or anything raw
    prefix_cache: PrefixSummary | Any = None


class FakePipelineClient:
    scripts: ClassVar[dict[str, Script]] = {}
    submitted: ClassVar[list[dict]] = []
    cancelled: ClassVar[list[str]] = []
    model_path: ClassVar[str] = ""
    reason: ClassVar[str] = ""  # the served model's reason (why it has no replica)
    cannot_serve: ClassVar[bool] = False  # the served model's: no replica is coming
    heads: ClassVar[dict[str, str]] = {}  # pipeline_id -> its head's address, when not the default
    closed: ClassVar[list[str]] = []  # head addresses of the clients closed
    source_error: ClassVar[Exception | None] = None  # what reading the served models raises, if set

    def __init__(self, head_address: str, auth_token: str, pipeline_id: str, timeout_s: float = 5.0):
        self.pipeline_id, self.head_address = pipeline_id, head_address

    @classmethod
    def reset(cls, model_path: str, scripts: dict[str, Script]) -> None:
        cls.model_path, cls.scripts, cls.reason, cls.cannot_serve = model_path, scripts, "", False
        cls.submitted, cls.cancelled, cls.heads, cls.closed = [], [], {}, []
        cls.source_error = None

    async def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams = SamplingParams(), *, max_tokens: int = 16,
        stop_token_ids: Sequence[int] = (), request_id: str | None = None, deadline_s: float | None = None,
        speculate: bool = True, traceparent: str | None = None,
    ) -> AsyncIterator[TokenEvent]:
        script = self.scripts[self.pipeline_id]
        nth = sum(1 for s in self.submitted if s["pipeline_id"] == self.pipeline_id)
        self.submitted.append(dict(pipeline_id=self.pipeline_id, prompt_ids=list(prompt_ids), params=params,
                                   max_tokens=max_tokens, stop_token_ids=tuple(stop_token_ids),
                                   request_id=request_id, speculate=speculate, traceparent=traceparent,
                                   at=time.monotonic(), first_token_at=None))
        record = self.submitted[-1]
        breaks = script.break_after[nth] if nth < len(script.break_after) else None
        tokens = script.tokens[_resumed_at(prompt_ids, script.tokens):]
        finished = False
        try:
            if script.error is not None:
                finished = True
                raise script.error
            for i, token in enumerate(tokens[:max_tokens]):
                if i == breaks:
                    finished = True
                    raise PipelineBroken(f"pipeline {self.pipeline_id}: stage 1 died")
                await asyncio.sleep(script.delay_s)
                last = i + 1 == max_tokens or token in stop_token_ids or i + 1 == len(tokens)
                reason = ("stop" if token in stop_token_ids else "length") if last else None
                finished = last
                record["first_token_at"] = record["first_token_at"] or time.monotonic()
                yield TokenEvent(request_id, token, reason, fake_logprobs(params, prompt_ids, token, i))
                if last:
                    return
        finally:
            if not finished:
                self.cancelled.append(request_id)

    async def stats(self) -> dict:
        script = self.scripts[self.pipeline_id]
        kv, ok, prefix = script.kv_tokens, script.healthy, script.prefix_cache
        return {"ok": ok, "kv_tokens_free_by_stage": {"0": kv}, "max_request_tokens": kv, "stages": [],
                "queue_depth": script.queue_depth, "reason": "" if ok else "stage 1 has not joined",
                "prefix_cache": prefix.to_json() if isinstance(prefix, PrefixSummary) else prefix}

    async def close(self) -> None:
        self.closed.append(self.head_address)


def fake_logprobs(params: SamplingParams, prompt_ids: Sequence[int], token: int,
                  i: int) -> TokenLogprobs | None:
    """What a pipeline returns where the request asks: the i-th token's entry -(i + 1) / 4 with
    alternatives token + 1, token + 2, ..., and with the first the prompt's, -(j + 1) / 8."""
    if not params.scores:
        return None
    value = -(i + 1) / 4
    entry = TokenLogprob(value, tuple((token + k + 1, value - k - 1) for k in range(params.logprobs or 0)))
    prompt = None
    if i == 0 and params.prompt_logprobs is not None:
        k = params.prompt_logprobs
        prompt = tuple(TokenLogprob(-(j + 1) / 8, ((t, -(j + 1) / 8),) * k)
                       for j, t in enumerate(prompt_ids[1:]))
    return TokenLogprobs(entry, prompt)


def _resumed_at(prompt_ids: Sequence[int], tokens: list[int]) -> int:
    """How many of the output's tokens the prompt already ends with (a resumed request's)."""
    for k in range(min(len(prompt_ids), len(tokens)), 0, -1):
        if list(prompt_ids[-k:]) == tokens[:k]:
            return k
    return 0


def served_models() -> list[ServedModel]:
    if FakePipelineClient.source_error is not None:
        raise FakePipelineClient.source_error
    replicas = tuple(
        ReplicaEndpoint(pipeline_id=pid, head_address=FakePipelineClient.heads.get(pid, f"tcp://fake/{pid}"),
                        auth_token="t",
                        kv_tokens=script.planned_kv_tokens, stages=script.stages, successor=script.successor,
                        health=ReplicaHealth() if script.successor is None
                        else ReplicaHealth(ok=False, reason="handing this replica over"))
        for pid, script in FakePipelineClient.scripts.items()
    )
    return [ServedModel("demo", FakePipelineClient.model_path, replicas, reason=FakePipelineClient.reason,
                        cannot_serve=FakePipelineClient.cannot_serve)]
