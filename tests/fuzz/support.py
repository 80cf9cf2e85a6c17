"""What the schema fuzz tests share: how many examples to run, the documented error shape as a
schemathesis check, and a WSGI app that keeps the test's database connection.

``MOTLEY_FUZZ_EXAMPLES`` sets the examples per operation (CI: a few; ``benchmarks/fuzz_api.py
--examples N``: many, and the coverage phase). Django's WSGI handler closes the database connection
after each request, which would end the test's transaction; the test client avoids that the same way
(``close_old_connections`` is disconnected while a test sends requests).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("MOTLEY_FUZZ_EXAMPLES", "4"))
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 10,  # CI: the same examples on every run, so a failure reproduces
    suppress_health_check=list(HealthCheck),
    database=None,
)


def bounded(schema):
    """The schema with schemathesis' coverage phase (boundary values of every field, not bounded by
    ``max_examples``: minutes over these APIs) only in a long run; CI has the examples and fuzzing."""
    schema.config.phases.coverage.enabled = EXAMPLES > 10
    return schema


def error_shape_problem(status: int, content_type: str, body: bytes) -> str | None:
    """Why an error response is not ``{"error": {"code", "message"}}`` (docs/api.md), or None."""
    if status < 400:
        return None
    if not content_type.startswith("application/json"):
        return f"a {status} answered {content_type!r}, not JSON"
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        return f"a {status} without an 'error' object: {body[:200]!r}"
    if not isinstance(error, dict) or not isinstance(error.get("message"), str) or not error.get("code"):
        return f"a {status} whose error has no message and code: {error!r}"
    return None


@contextmanager
def in_test_transaction() -> Iterator[WSGIHandler]:
    """A WSGI app over the test's own database connection."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
