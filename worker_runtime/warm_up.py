"""The head's warm-up request: one short request of its own through a new pipeline before it says ok.

The first micro-batch through freshly started stages pays for what torch and the kernels do on first
use and for the cache pages touched first (a 2-stage demo pipeline: time to first token 0.53 s for
the first client request, 0.20 s with a warm-up before it, 0.16 s for the next ones). The gateway
routes to a pipeline only once its head is ok, and in a handover beside the old pipeline serves
meanwhile, so no client pays for it. Only a new head's pipeline warms up: one re-formed around a
surviving head (a stage restarted or reloaded in place) has clients waiting, whose own first
micro-batch warms it as soon (replacement_bench in place: a warm-up there lengthened the pause).
"""

from __future__ import annotations

import time

from contracts.sampling import SamplingParams

from .scheduler import Request

CLIENT = b""  # the warm-up request's client id: nothing is sent to it
PROMPT_TOKENS, MAX_TOKENS = 32, 2


def warm_up_request(*, epoch: int, vocab_size: int, largest: int, max_batch_tokens: int,
                    timeout_s: float) -> Request:
    """A greedy request of up to ``PROMPT_TOKENS`` prompt tokens that fits the smallest stage's KV
    (``largest``) and one micro-batch, ending within ``timeout_s``."""
    tokens = max(1, min(PROMPT_TOKENS, largest - MAX_TOKENS, max_batch_tokens))
    return Request(f"warm-up-{epoch}", CLIENT, [i % vocab_size for i in range(tokens)], SamplingParams(),
                   MAX_TOKENS, deadline=time.monotonic() + timeout_s)
