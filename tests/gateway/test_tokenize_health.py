"""vLLM's /health, /tokenize and /detokenize against stand-in replicas: shapes, keys, errors."""

from __future__ import annotations

import json

import pytest
from django.db import DatabaseError
from django.test import AsyncClient

from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway import fakes
from tests.gateway.fakes import Script

pytestmark = pytest.mark.django_db(transaction=True)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Héllo 世界"}]


async def post(path: str, body, key: str | None):
    headers = {"headers": {"Authorization": f"Bearer {key}"}} if key else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return await AsyncClient().post(path, data, content_type="application/json", **headers)


async def test_tokenize_a_prompt_as_vllm_answers(fake_pipeline, api_key, demo_model):
    fake_pipeline({"r0": Script()})
    tokenizer = ModelTokenizer.load(demo_model)
    response = await post("/tokenize", {"model": "demo", "prompt": "The quick brown fox"}, api_key)
    assert response.status_code == 200, response.content
    ids = tokenizer.encode_prompt("The quick brown fox")
    assert response.json() == {"count": len(ids), "max_model_len": 256, "tokens": ids, "token_strs": None}
    body = {"model": "demo", "prompt": "The quick brown fox", "add_special_tokens": False,
            "return_token_strs": True}
    bare = await post("/tokenize", body, api_key)
    ids = tokenizer.tokenizer.encode("The quick brown fox", add_special_tokens=False).ids
    assert bare.json()["tokens"] == ids
    assert bare.json()["token_strs"] == [tokenizer.tokenizer.id_to_token(i) for i in ids]


async def test_tokenize_messages_renders_the_chat_template_as_the_chat_endpoint(fake_pipeline, api_key,
                                                                              demo_model):
    fake = fake_pipeline({"r0": Script(tokens=[5])})
    tokenizer = ModelTokenizer.load(demo_model)
    counted = (await post("/tokenize", {"model": "demo", "messages": MESSAGES}, api_key)).json()
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": 1}
    chat = await post("/v1/chat/completions", body, api_key)
    assert chat.json()["usage"]["prompt_tokens"] == counted["count"]
    assert counted["tokens"] == fake.submitted[0]["prompt_ids"] == tokenizer.encode_chat(MESSAGES)
    bare = await post("/tokenize", {"model": "demo", "messages": MESSAGES, "add_generation_prompt": False},
                      api_key)
    assert bare.json()["tokens"] == tokenizer.encode_chat(MESSAGES, add_generation_prompt=False)
    assert bare.json()["count"] < counted["count"]


async def test_detokenize_round_trips_with_special_tokens(fake_pipeline, api_key, demo_model):
    fake_pipeline({"r0": Script()})
    ids = (await post("/tokenize", {"model": "demo", "messages": MESSAGES}, api_key)).json()["tokens"]
    response = await post("/detokenize", {"model": "demo", "tokens": ids}, api_key)
    assert response.status_code == 200
    text = response.json()["prompt"]
    tokenizer = ModelTokenizer.load(demo_model)
    assert "Héllo 世界" in text and text.startswith(tokenizer.bos_token)
    assert tokenizer.encode_prompt(text, add_special_tokens=False) == ids
    assert (await post("/detokenize", {"model": "demo", "tokens": []}, api_key)).json() == {"prompt": ""}


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
@pytest.mark.parametrize("key", [None, "nope"])
async def test_tokenize_and_detokenize_need_a_key(fake_pipeline, path, key):
    fake_pipeline({"r0": Script()})
    response = await post(path, {"model": "demo", "prompt": "x", "tokens": [1]}, key)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "x"}, "model"),
    ("/tokenize", {"model": "demo"}, "prompt"),
    ("/tokenize", {"model": "demo", "prompt": "x", "messages": MESSAGES}, "prompt"),
    ("/tokenize", {"model": "demo", "prompt": 5}, "prompt"),
    ("/tokenize", {"model": "demo", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/tokenize", {"model": "demo", "prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"model": "demo", "messages": MESSAGES, "add_generation_prompt": 1},
     "add_generation_prompt"),
    ("/detokenize", {"model": "demo"}, "tokens"),
    ("/detokenize", {"model": "demo", "tokens": [1, "2"]}, "tokens"),
    ("/detokenize", {"model": "demo", "tokens": [-1]}, "tokens"),
    ("/detokenize", {"model": "demo", "tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": [1]}, "model"),
])
async def test_a_bad_body_is_a_400_naming_the_field(fake_pipeline, api_key, path, body, param):
    fake_pipeline({"r0": Script()})
    response = await post(path, body, api_key)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_not_json_unknown_models_and_restricted_keys_answer_as_v1(fake_pipeline, api_key,
                                                                        django_user_model, path):
    fake_pipeline({"r0": Script()})
    assert (await post(path, "{", api_key)).json()["error"]["code"] == "invalid_json"
    unknown = await post(path, {"model": "gpt-9", "prompt": "x", "tokens": [1]}, api_key)
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    user = await django_user_model.objects.acreate(username="bob")
    _, other = await _key(user, allowed_models=["other"])
    refused = await post(path, {"model": "demo", "prompt": "x", "tokens": [1]}, other)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    wrong_method = await AsyncClient().get(path, headers={"Authorization": f"Bearer {api_key}"})
    assert wrong_method.status_code == 405


async def _key(user, **limits):
    from asgiref.sync import sync_to_async

    from controlplane.gateway.accounts.services import api_key_set_limits

    def make():
        api_key, raw = api_key_create(user=user, name="restricted")
        return api_key_set_limits(api_key=api_key, **limits), raw

    return await sync_to_async(make)()


async def test_health_is_200_without_a_key_when_a_replica_serves(fake_pipeline):
    fake_pipeline({"r0": Script(healthy=False), "r1": Script()})
    response = await AsyncClient().get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_health_is_503_naming_why_without_naming_replicas(fake_pipeline):
    fake_pipeline({"r0": Script(healthy=False)})
    response = await AsyncClient().get("/health")
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "service_unavailable"
    assert error["message"].endswith("no replica of any served model is healthy.")
    assert "r0" not in error["message"] and "joined" not in error["message"]


@pytest.mark.parametrize(("served", "reason"), [
    ([], "no model is deployed"),
    ("no replicas", "no deployment has a replica yet (deploying or re-planning)"),
    (DatabaseError("down"), "the control plane's database cannot be reached"),
])
async def test_health_names_each_reason(fake_pipeline, monkeypatch, served, reason):
    fake = fake_pipeline({})
    if isinstance(served, Exception):
        fake.source_error = served
    elif served == []:
        monkeypatch.setattr(fakes, "served_models", lambda: [])
    response = await AsyncClient().get("/health")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == f"The gateway cannot serve any model: {reason}."


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_a_body_over_the_gateways_limit_is_its_413(fake_pipeline, api_key, settings, path):
    fake_pipeline({"r0": Script()})
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "MAX_BODY_BYTES": 1000}
    response = await post(path, {"model": "demo", "prompt": "x" * 2000, "tokens": [1] * 500}, api_key)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
