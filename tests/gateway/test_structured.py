"""Structured outputs at the gateway against stand-in replicas: each shape (OpenAI's response_format,
vLLM's structured_outputs and its older guided_* keys) submits the constraint the pipeline enforces,
a bad one is a 400 naming its field before anything is submitted, and a resumed request tells the
head how much of its prompt is output. Enforcement itself: tests/pipeline/test_structured.py and the
live test (test_live.py)."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from contracts.structured import MAX_SPEC_CHARS, StructuredConstraint
from tests.gateway.fakes import Script
from tests.gateway.test_views import post, tokens

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TYPED = StructuredConstraint("json_schema", json.dumps(SCHEMA))
NAMED = {"name": "a", "schema": SCHEMA}
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.mark.parametrize(("extra", "expected"), [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredConstraint("json_object", "")),
    ({"response_format": {"type": "json_schema", "json_schema": {**NAMED, "strict": True}}}, TYPED),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, TYPED),
    ({"structured_outputs": {"regex": "[a-z]+"}}, StructuredConstraint("regex", "[a-z]+")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, StructuredConstraint("choice", '["yes", "no"]')),
    ({"structured_outputs": {"grammar": 'start: "x"'}}, StructuredConstraint("grammar", 'start: "x"')),
    ({"structured_outputs": {"json_object": True}}, StructuredConstraint("json_object", "")),
    ({"guided_regex": "[0-9]+"}, StructuredConstraint("regex", "[0-9]+")),
    ({"guided_json": SCHEMA}, TYPED),
])
async def test_each_shape_submits_its_constraint(fake_pipeline, api_key, extra, expected):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6, 7])})
    completion = {"model": "demo", "prompt": "x"}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", completion)):
        response = await post(AsyncClient(), path, {**body, **extra}, api_key)
        assert response.status_code == 200, response.content
        assert fake.submitted[-1]["params"].constraint == expected


@pytest.mark.parametrize(("extra", "param", "says"), [
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"response_format": "json"}, "response_format", "object"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "object"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "nope"}}}},
     "response_format.json_schema.schema", "nope"),
    ({"response_format": {"type": "json_schema", "json_schema": {**NAMED, "strict": 1}}},
     "response_format.json_schema.strict", "boolean"),
    ({"structured_outputs": {"regex": "a(b"}}, "structured_outputs.regex", "unclosed group"),
    ({"structured_outputs": {"grammar": "start: foo"}}, "structured_outputs.grammar", "foo"),
    ({"structured_outputs": {"regex": "a" * (MAX_SPEC_CHARS + 1)}}, "structured_outputs.regex", "at most"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty"),
    ({"structured_outputs": {"json": "{nope"}}, "structured_outputs.json", "not JSON"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs", "exactly one"),
    ({"guided_regex": "a(b"}, "guided_regex", "unclosed group"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "one of"),
])
async def test_a_bad_constraint_is_a_400_naming_its_field(fake_pipeline, api_key, extra, param, says):
    fake = fake_pipeline({"r0": Script(tokens=[5])})
    response = await post(AsyncClient(), "/v1/chat/completions", {**CHAT, **extra}, api_key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and says in error["message"], error
    assert not fake.submitted


async def test_a_resumed_request_says_how_much_of_its_prompt_is_output(fake_pipeline, api_key, demo_model):
    output = tokens(demo_model)
    fake = fake_pipeline({"r0": Script(tokens=output, break_after=[3]),
                          "r1": Script(tokens=output, queue_depth=4)})
    body = {"model": "demo", "prompt": "x", "max_tokens": 50, "seed": 1,
            "structured_outputs": {"regex": ".*"}}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    first, resumed = fake.submitted
    assert first["params"].constraint == StructuredConstraint("regex", ".*")
    assert resumed["params"].constraint == StructuredConstraint("regex", ".*", generated=3)
    assert resumed["prompt_ids"][-3:] == output[:3]
