"""The errors a pipeline caller can get (contracts §2), and their names on the wire.

The head sends ``{"type": "error", "kind": ...}``; the client raises the matching exception, so the
gateway can answer 503 for a broken pipeline, 429/503 for a refused request, 504 for a deadline.
"""

from __future__ import annotations


class PipelineError(RuntimeError):
    """A request failed; the message says why."""

    kind = "failed"


class PipelineBroken(PipelineError):
    """A stage died, restarted or stopped answering, or the head is unreachable or draining."""

    kind = "broken"


class RequestRejected(PipelineError):
    """Refused before it ran: the KV budget cannot hold it, the queue is full, or the request is invalid."""

    kind = "rejected"


class DeadlineExceeded(PipelineError):
    """The request's deadline passed before it finished."""

    kind = "deadline"


ERRORS_BY_KIND: dict[str, type[PipelineError]] = {
    cls.kind: cls for cls in (PipelineError, PipelineBroken, RequestRejected, DeadlineExceeded)
}
