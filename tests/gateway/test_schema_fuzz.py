"""Schemathesis against the gateway's ``/v1/`` routes and vLLM's root ones, held to their hand-written
OpenAPI document (``controlplane/gateway/openapi.yaml``): no 5xx but the documented 503/504, every
status, content type and body as documented, every error in OpenAI's shape (its schema says so).

Requests go through Django's ASGI handler (httpx's ASGI transport: one event loop a request, as
under daphne; a WSGI handler would run a stream's first token and the rest on two loops), with a
valid key, to the stand-in pipeline of tests/gateway/fakes.py serving model "demo": the fuzzer's
bodies reach validation, tokenization, the limits, admission, generation and usage accounting. The
document's ``model`` is narrowed to "demo" and an unknown name so that bodies reach more than the
404. The database is committed to, as a server would, and flushed after the test.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import schemathesis
import yaml
from asgiref.sync import async_to_sync
from django.core.handlers.asgi import ASGIHandler
from schemathesis.checks import content_type_conformance, response_schema_conformance, status_code_conformance
from schemathesis.core.transport import Response

import controlplane.gateway
from tests.fuzz.support import FUZZ_SETTINGS, bounded, error_shape_problem
from tests.gateway.fakes import Script

DOCUMENT = Path(controlplane.gateway.__file__).with_name("openapi.yaml")
DOCUMENTED_UNAVAILABLE = {503, 504}  # no replica within the wait, a request past its deadline


def fuzzed_document() -> dict:
    raw = yaml.safe_load(DOCUMENT.read_text())
    raw["components"]["schemas"]["Sampling"]["properties"]["model"] = {"type": "string",
                                                                       "enum": ["demo", "gone"]}
    return raw


schema = bounded(schemathesis.openapi.from_dict(fuzzed_document()))


@schemathesis.check
def no_undocumented_server_error(ctx, response, case):
    """A 5xx other than the documented unavailability is a defect (schemathesis' not_a_server_error,
    less those two)."""
    if response.status_code >= 500 and response.status_code not in DOCUMENTED_UNAVAILABLE:
        raise AssertionError(f"{response.status_code}: {response.content[:300]!r}")


@schemathesis.check
def openai_error_shape(ctx, response, case):
    """Every error, documented or not (a method the route does not take), is OpenAI's shape."""
    problem = error_shape_problem(response.status_code, response.headers.get("content-type", [""])[0],
                                  response.content)
    if problem is None and response.status_code >= 400:
        error = response.json()["error"]
        problem = None if {"message", "type", "param", "code"} <= set(error) else f"not OpenAI's: {error}"
    if problem:
        raise AssertionError(problem)


CHECKS = [no_undocumented_server_error, openai_error_shape, status_code_conformance, content_type_conformance,
          response_schema_conformance]


def test_the_document_lists_every_v1_route():
    """A route added to /v1/ or vLLM's root routes without documenting it fails here, not silently
    outside the fuzzing."""
    from controlplane.gateway import root_urls, urls

    documented = set(yaml.safe_load(DOCUMENT.read_text())["paths"])
    routes = {f"/v1/{p.pattern}" for p in urls.urlpatterns} | {f"/{p.pattern}" for p in root_urls.urlpatterns}
    assert routes == documented


@pytest.mark.timeout(600)
@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@FUZZ_SETTINGS
def test_v1_answers_as_its_document_says(case, fake_pipeline, api_key, settings):
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "WAIT_S": 0.05}
    fake_pipeline({"d1-r0": Script(tokens=[5, 6, 7])})
    headers = {"Authorization": f"Bearer {api_key}"}
    response = async_to_sync(_send)(case, headers)
    case.validate_response(response, checks=CHECKS, headers=headers)


async def _send(case, headers: dict) -> Response:
    transport = httpx.ASGITransport(app=ASGIHandler())
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        kwargs = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
        client.cookies = kwargs.pop("cookies", None) or {}
        if "data" in kwargs:  # raw bytes (schemathesis' negative bodies): httpx calls that content
            kwargs["content"] = kwargs.pop("data")
        response = await client.request(**kwargs)
    return Response.from_httpx(response, verify=False)
