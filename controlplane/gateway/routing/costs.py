"""What a request costs on a replica: a continuous-batching model with four cost figures.

A pipeline replica runs steps; each step carries one decode token of every running sequence plus
chunks of waiting prompts. Its time is close to ``decode_step_s`` (reading the weights, crossing the
stages) plus ``decode_s_per_token`` per sequence in the batch, ``kv_read_s_per_token`` per cached
token those sequences attend to (decode reads each sequence's whole KV cache), and
``prefill_s_per_token`` per prompt token in it. A new request that must decode ``m`` tokens
therefore waits for the prompts queued ahead of it, then shares ``m`` steps with every running
sequence still alive at that step: that is the estimate below, which a round-robin or a token count
cannot see (a slow replica's step is long even when it is idle). A prompt's leading tokens that the
replica's head already caches (``RequestShape.cached_on``) are not prefilled again: only the rest
count, in its own time to first token and, while it waits, in the queue of the requests behind it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field

from contracts.prefix_cache import PrefixSummary
from controlplane.gateway.routing.prefix import PromptPrefix


@dataclass(frozen=True)
class ReplicaCosts:
    """Per-token costs of one replica, in seconds.

    Where they come from is the directory's business (``controlplane/gateway/serving/directory.py``): the
    plan's predictions, a models file, else assumed defaults; ``benchmarks/router_validate.py``
    measures them by probing a pipeline. The gateway does not measure them from a running replica.

    ``decode_step_s``: a step's fixed time (the latency floor of one decoded token);
    ``decode_s_per_token``: what each extra sequence in a step adds; ``kv_read_s_per_token``: what
    each cached token of those sequences adds; ``prefill_s_per_token``: what each prompt token adds.
    """

    prefill_s_per_token: float
    decode_s_per_token: float
    decode_step_s: float
    kv_read_s_per_token: float = 0.0

    def __post_init__(self) -> None:
        if min(vars(self).values()) < 0:
            raise ValueError(f"costs must be non-negative: {self}")

    def scaled(self, factor: float) -> ReplicaCosts:
        """The same replica running ``factor`` times slower (throttled, emulated)."""
        return ReplicaCosts(
            self.prefill_s_per_token * factor,
            self.decode_s_per_token * factor,
            self.decode_step_s * factor,
            self.kv_read_s_per_token * factor,
        )


@dataclass(frozen=True)
class RequestShape:
    """What the router knows of a request before it runs: its prompt and its output budget.
    ``prefix``: the prompt's token ids, to ask each replica how many it caches (none: nothing is
    expected to be cached anywhere)."""

    prompt_tokens: int
    max_tokens: int
    prefix: PromptPrefix | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise ValueError(f"a request has at least one prompt token and one output token: {self}")

    def prefix_blind(self) -> RequestShape:
        """The same request with its prompt unknown: no replica is expected to cache any of it."""
        return RequestShape(self.prompt_tokens, self.max_tokens)

    @property
    def kv_tokens(self) -> int:
        """KV space the request may use at most: reserved in full, so an admitted request can finish."""
        return self.prompt_tokens + self.max_tokens

    def cached_on(self, summary: PrefixSummary | None, also: Container[int] = ()) -> int:
        """Leading prompt tokens a head with this summary (and the blocks named in ``also``) is expected
        to hold (0 without a summary)."""
        if summary is None or self.prefix is None:
            return 0
        return min(self.prefix.cached_tokens(summary, also), self.prompt_tokens - 1)


def _context_sum(context: int, steps: int) -> int:
    """Cached tokens read over ``steps`` decode steps of a sequence that starts at ``context``."""
    return steps * context + steps * (steps - 1) // 2


def time_to_first_token(costs: ReplicaCosts, request: RequestShape, queued_prefill_tokens: int,
                        cached_tokens: int = 0) -> float:
    """Prompts ahead of it, its own prompt but the ``cached_tokens`` the head holds, then the step that
    samples its first token."""
    prefill = queued_prefill_tokens + request.prompt_tokens - cached_tokens
    return costs.prefill_s_per_token * prefill + costs.decode_step_s


def time_to_finish(
    costs: ReplicaCosts,
    request: RequestShape,
    queued_prefill_tokens: int,
    running: list[tuple[int, int]],
    cached_tokens: int = 0,
) -> float:
    """Estimated end-to-end time of ``request`` on a replica with this backlog.

    ``running`` holds ``(context, tokens left to decode)`` of each outstanding sequence; a sequence
    shares ``min(left, max_tokens)`` of the new request's steps. Decoding reads the whole context,
    cached or not; only the prefill is spared the ``cached_tokens``.
    """
    m = request.max_tokens
    shared = [(context, min(left, m)) for context, left in running]
    decode = m * costs.decode_step_s + costs.decode_s_per_token * (m + sum(steps for _, steps in shared))
    kv_read = _context_sum(request.prompt_tokens, m) + sum(_context_sum(c, s) for c, s in shared)
    return (
        time_to_first_token(costs, request, queued_prefill_tokens, cached_tokens)
        - costs.decode_step_s
        + decode
        + costs.kv_read_s_per_token * kv_read
    )
