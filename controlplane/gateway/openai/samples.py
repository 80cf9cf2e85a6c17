"""The ``n`` samples of one request: one Generation each, sharing the prompt's prefill on one replica.

The first sample is placed by the router like any request. The others go to the same replica once the
first has its first token: by then the head has run the prompt's prefill and named its full blocks in
its prefix cache (worker_runtime/prefix_index.py), so each later sample finds them cached and computes
only the prompt's last block (the partial one, or the full one that holds the last token, whose logits
it needs). Submitted together, every sample would miss and compute the whole prompt.

Seeds: sample 0 uses the request's ``seed`` and sample i > 0 ``sample_seed(seed, i)``, so the same
request gives the same n outputs, and sample 0 is what the request with n=1 gives. Without a seed every
sample draws its own randomness. With ``echo`` and log-probabilities the prompt's are asked of sample 0
only (a scored prompt is computed whole, without the cache).

The samples' deltas come in one stream, in the order they are produced, each with its choice index.
An error of any sample ends the request (OpenAI answers every choice or an error): the others are
cancelled, which frees their KV on the pipeline. Each sample migrates on its own when its pipeline
breaks (generation.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import replace

from contracts.logprobs import TokenLogprob
from controlplane.gateway.openai.generation import Delta, Generation
from controlplane.gateway.openai.protocol import GenerationRequest
from controlplane.gateway.openai.request_span import UNTRACED, RequestSpan
from controlplane.gateway.serving.runtime import ModelRoute

SEED_STRIDE = 0x9E3779B97F4A7C15  # 2**64 over the golden ratio: consecutive samples' seeds far apart


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample ``index`` of a request seeded with ``seed``: the seed itself for sample 0,
    ``(seed + index * SEED_STRIDE) mod 2**63`` after it; None (unseeded) stays None."""
    if seed is None or index == 0:
        return seed
    return (seed + index * SEED_STRIDE) % 2**63


async def samples_start(
    *,
    route: ModelRoute,
    request: GenerationRequest,
    prompt_ids: list[int],
    max_tokens: int,
    deadline_s: float,
    span: RequestSpan = UNTRACED,
) -> Samples:
    """Place the first sample on a replica (waiting for one if need be) or raise the OpenAIError that
    refuses the request; the others are placed beside it by ``Samples.deltas``. The span follows the
    first sample."""
    def sample(index: int) -> Generation:
        asked = replace(request, seed=sample_seed(request.seed, index), echo=request.echo and not index)
        return Generation(route, uuid.uuid4().hex, asked, prompt_ids, max_tokens, deadline_s,
                          span if index == 0 else UNTRACED)

    samples = Samples([sample(i) for i in range(request.n)])
    await samples.first.place()
    return samples


class Samples:
    def __init__(self, generations: list[Generation]) -> None:
        self.generations = generations
        self.first = generations[0]
        for later in generations[1:]:  # one deadline for the request
            later.started = self.first.started

    @property
    def request_id(self) -> str:
        return self.first.request_id

    @property
    def route(self) -> ModelRoute:
        return self.first.route

    @property
    def prompt_ids(self) -> list[int]:
        return self.first.prompt_ids

    @property
    def prompt_logprobs(self) -> tuple[TokenLogprob, ...] | None:
        return self.first.prompt_logprobs

    @property
    def completion_tokens(self) -> int:
        """Every sample's, as OpenAI counts ``usage.completion_tokens``."""
        return sum(g.completion_tokens for g in self.generations)

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every sample's deltas, each with its ``index``, until every sample finished."""
        if len(self.generations) == 1:
            async with aclosing(self.first.deltas()) as deltas:
                async for delta in deltas:
                    yield delta
            return
        queue: asyncio.Queue[tuple[int, Delta | None, Exception | None]] = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(0, queue))]
        tasks.append(asyncio.create_task(self._follow(queue, tasks)))
        unfinished = len(self.generations)
        try:
            while unfinished:
                index, delta, error = await queue.get()
                if error is not None:
                    raise error
                yield replace(delta, index=index)
                unfinished -= delta.finish_reason is not None
        finally:  # also when the client went away: every sample's stream is closed, its KV freed
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, queue: asyncio.Queue, tasks: list[asyncio.Task]) -> None:
        """Once the first sample's prompt is prefilled, the others on its replica."""
        await self.first.prefilled.wait()
        for index, later in enumerate(self.generations[1:], start=1):
            later.place_beside(self.first)
            tasks.append(asyncio.create_task(self._pump(index, queue)))

    async def _pump(self, index: int, queue: asyncio.Queue) -> None:
        try:
            async with aclosing(self.generations[index].deltas()) as deltas:
                async for delta in deltas:
                    queue.put_nowait((index, delta, None))
        except Exception as exc:  # an OpenAIError (or a bug): the request's error
            queue.put_nowait((index, None, exc))
