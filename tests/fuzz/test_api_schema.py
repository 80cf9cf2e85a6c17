"""Schemathesis against ``/api/v1/``'s own OpenAPI schema (drf-spectacular's, as /api/schema/ serves it),
as an admin and as a plain user: no 5xx, every status, content type and body the schema documents,
and every error in the one documented shape (docs/api.md, "Errors").

The requests go through Django's WSGI handler inside the test's transaction, so whatever the fuzzer
creates, stops, drains or deletes is rolled back, and no task leaves the process (sends wait for a
commit that never comes; ``celery_app`` is replaced all the same). A seeded fleet, model and
deployment give the ``{id}`` routes rows to find.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from drf_spectacular.generators import SchemaGenerator
from rest_framework.authtoken.models import Token
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from controlplane.common import task_sending
from controlplane.enrollment.services import agent_register, join_token_create
from tests.fuzz.support import FUZZ_SETTINGS, bounded, error_shape_problem, in_test_transaction

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
T4 = {"model": "T4", "memory_bytes": 16 * 1024**3, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
      "bf16_tflops": 0.0, "int8_tops": 130.0, "emulated": True}


def api_v1_schema() -> dict:
    raw = SchemaGenerator().get_schema(request=None, public=True)
    raw["paths"] = {p: ops for p, ops in raw["paths"].items() if p.startswith("/api/v1/")}
    return raw


schema = bounded(schemathesis.openapi.from_dict(api_v1_schema()))


@schemathesis.check
def documented_error_shape(ctx, response, case):
    """Every 4xx is ``{"error": {"code", "message"}}`` (the checks above only see what the schema says)."""
    problem = error_shape_problem(response.status_code, response.headers.get("content-type", [""])[0],
                                  response.content)
    if problem:
        raise AssertionError(problem)


class _NoSend:
    def send_task(self, *args, **kwargs):
        raise AssertionError("a fuzzed request sent a Celery task out of the test")


@pytest.fixture
def seeded(db, monkeypatch):
    """Two emulated nodes with a card each (ids from 1 upward, where the fuzzer looks often)."""
    monkeypatch.setattr(task_sending, "celery_app", _NoSend())
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    for i in range(2):
        agent_register(join_token=secret, name=f"fuzz{i}", address="127.0.0.1", emulated=True, devices=[T4])


@pytest.fixture
def token(db, superuser) -> str:
    """One caller for all of a test's examples (hypothesis runs the body many times, fixtures once)."""
    users = get_user_model().objects
    user = users.create_superuser("root") if superuser else users.create_user("plain")
    return Token.objects.create(user=user).key


@pytest.mark.timeout(600)
@pytest.mark.parametrize("superuser", [True, False], ids=["admin", "plain-user"])
@schema.parametrize()
@FUZZ_SETTINGS
def test_api_v1_answers_as_its_schema_says(case, token, seeded):
    headers = {"Authorization": f"Token {token}"}
    with in_test_transaction() as app:
        response = case.call(app=app, headers=headers)
    case.validate_response(response, checks=CHECKS, additional_checks=[documented_error_shape],
                           headers=headers)
