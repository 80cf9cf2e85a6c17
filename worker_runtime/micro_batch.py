"""What the head sends for a micro-batch and what it tells a client of its tokens.

The logit rows the last stage returns for a sequence: one (its next token), one per proposal more
for a speculative step (speculation.py), and for a prompt scored for its log-probabilities (a request
with ``prompt_logprobs``, in its prefill) one per prompt position: the rows before the last score the
prompt's own next tokens (``Batch.scored``), the last is sampled as always. A request that scores is
never speculated (``Request.from_submit``), and its prompt is computed whole, not reused from the
prefix cache (prefix_index.py), so its prefill has every row.
"""

from __future__ import annotations

from dataclasses import replace

from contracts.logprobs import item_logprobs
from contracts.tracing import traceparent_of

from .scheduler import Request
from .stage import Batch


def micro_batch_input(requests: list[Request], inputs: list[tuple[list[int], int]]) -> Batch:
    """The batch of ``requests``, whose next tokens and first positions are ``inputs``."""
    scored = [tokens[1:] if not r.output and r.params.prompt_logprobs is not None else []
              for r, (tokens, _) in zip(requests, inputs)]
    rows = [len(r.proposals) + 1 + len(s) for r, s in zip(requests, scored)]
    batch = Batch.of_tokens([r.seq_id for r in requests], [t for t, _ in inputs], [s for _, s in inputs],
                            rows if any(n > 1 for n in rows) else None, scored if any(scored) else None)
    # A traced request's prefill names its span to the stages after the head (stage_trace.py).
    traces = {r.seq_id: parent for r in requests
              if r.trace is not None and not r.output and (parent := traceparent_of(r.trace.span))}
    # A resumed constrained request's output so far, for its matcher on the last stage (structured.py).
    replay = {r.seq_id: r.prompt[-c.generated:] for r in requests
              if not r.output and (c := r.params.constraint) is not None and c.generated}
    return replace(batch, traces=traces or None, replay=replay or None) if traces or replay else batch


def token_item(request: Request, token: int, reason: str | None, logprobs: dict[int, list]) -> list:
    """An item of a ``tokens`` frame to the client (contracts §2): the request's id, its token and
    finish reason, and its log-probabilities where it asked (``logprobs``: the last stage's entries
    by sequence)."""
    item = [request.request_id, token, reason]
    if (entries := logprobs.get(request.seq_id)) is not None:
        item.append(item_logprobs(entries))
    return item
