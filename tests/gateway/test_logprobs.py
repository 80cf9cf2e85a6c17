"""Log-probabilities and echo through /v1/ against stand-in replicas: OpenAI's shapes, streamed and
not, what the pipeline is asked for, and the 400s. Their values against transformers are the pipeline's
tests' (tests/pipeline/test_logprobs.py) and the live one's (test_live.py)."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway.fakes import Script
from tests.gateway.test_views import post, sse_events

pytestmark = pytest.mark.django_db(transaction=True)

TOKENS = [72, 101, 108, 108, 111, 44, 32, 119]
MESSAGES = [{"role": "user", "content": "Hi"}]


def text_of(demo_model, token_id: int) -> str:
    return ModelTokenizer.load(demo_model).tokenizer.decode([token_id], skip_special_tokens=False)


async def test_chat_logprobs_in_openais_shape(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": 5, "logprobs": True, "top_logprobs": 2}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 200, response.content
    content = response.json()["choices"][0]["logprobs"]["content"]
    assert response.json()["choices"][0]["logprobs"]["refusal"] is None
    assert [c["token"] for c in content] == [text_of(demo_model, t) for t in TOKENS[:5]]
    assert [c["logprob"] for c in content] == [-0.25, -0.5, -0.75, -1.0, -1.25]
    first = content[0]
    assert first["bytes"] == list(first["token"].encode())
    assert first["top_logprobs"] == [
        {"token": text_of(demo_model, t), "logprob": lp, "bytes": list(text_of(demo_model, t).encode())}
        for t, lp in ((TOKENS[0] + 1, -1.25), (TOKENS[0] + 2, -2.25))]
    params = fake.submitted[0]["params"]
    assert (params.logprobs, params.prompt_logprobs) == (2, None)


async def test_chat_logprobs_streamed_are_the_whole_answers_split(fake_pipeline, api_key):
    fake_pipeline({"r0": Script(tokens=TOKENS)})
    body = {"model": "demo", "messages": MESSAGES, "max_tokens": 8, "logprobs": True}
    whole = (await post(AsyncClient(), "/v1/chat/completions", body, api_key)).json()
    streaming = await post(AsyncClient(), "/v1/chat/completions", {**body, "stream": True}, api_key)
    events = await sse_events(streaming)
    streamed = [c for e in events for choice in e["choices"] if choice["logprobs"]
                for c in choice["logprobs"]["content"]]
    assert streamed == whole["choices"][0]["logprobs"]["content"]
    assert len(streamed) == whole["usage"]["completion_tokens"] == 8
    assert all(c["top_logprobs"] == [] for c in streamed)  # top_logprobs 0: none


async def test_completion_logprobs_in_the_legacy_shape(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    body = {"model": "demo", "prompt": "Hello", "max_tokens": 3, "logprobs": 1}
    choice = (await post(AsyncClient(), "/v1/completions", body, api_key)).json()["choices"][0]
    texts = [text_of(demo_model, t) for t in TOKENS[:3]]
    assert choice["logprobs"] == {
        "tokens": texts,
        "token_logprobs": [-0.25, -0.5, -0.75],
        "top_logprobs": [{**{text_of(demo_model, t + 1): lp - 1}, text: lp}
                         for t, text, lp in zip(TOKENS, texts, (-0.25, -0.5, -0.75))],
        "text_offset": [0, len(texts[0]), len(texts[0]) + len(texts[1])],
    }
    assert fake.submitted[0]["params"].prompt_logprobs is None


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_logprobs_scores_the_prompt_first(fake_pipeline, api_key, demo_model, stream):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    prompt_ids = ModelTokenizer.load(demo_model).encode_prompt("Hello world")
    body = {"model": "demo", "prompt": "Hello world", "max_tokens": 2, "logprobs": 0, "echo": True,
            "stream": stream}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    if stream:
        choices = [e["choices"][0] for e in await sse_events(response)]
        text = "".join(c["text"] for c in choices)
        logprobs = {key: [v for c in choices for v in c["logprobs"][key]] for key in choices[0]["logprobs"]}
    else:
        text, logprobs = response.json()["choices"][0]["text"], response.json()["choices"][0]["logprobs"]
    generated = ModelTokenizer.load(demo_model).tokenizer.decode(TOKENS[:2])
    assert text == "Hello world" + generated
    n = len(prompt_ids)
    assert logprobs["tokens"] == [text_of(demo_model, t) for t in prompt_ids + TOKENS[:2]]
    assert logprobs["token_logprobs"] == [None, *(-(j + 1) / 8 for j in range(n - 1)), -0.25, -0.5]
    assert logprobs["top_logprobs"][0] is None
    assert logprobs["top_logprobs"][1] == {text_of(demo_model, prompt_ids[1]): -1 / 8}
    offsets = logprobs["text_offset"]
    assert offsets[0] == 0
    assert all(b - a == len(t) for a, b, t in zip(offsets, offsets[1:], logprobs["tokens"]))
    params = fake.submitted[0]["params"]
    assert (params.logprobs, params.prompt_logprobs) == (0, 0)


async def test_lm_evaluation_harness_loglikelihood_payload(fake_pipeline, api_key):
    """lm_eval's ``local-completions`` body for one (context, continuation) pair, as its
    ``_create_payload`` writes it: a batch of one token-id prompt, echo, one token more, one alternative.
    It reads ``token_logprobs[ctxlen:-1]`` (the continuation's) and compares each with the top of its
    ``top_logprobs`` map (greedy or not)."""
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    context, continuation = [5, 6, 7, 8], [9, 10]
    body = {"model": "demo", "prompt": [context + continuation], "temperature": 0, "max_tokens": 1,
            "logprobs": 1, "seed": 1234, "echo": True}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    logprobs = response.json()["choices"][0]["logprobs"]
    n = len(context + continuation)
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == n + 1
    scored = logprobs["token_logprobs"][len(context):-1]  # the continuation's: the prompt's j-th is -(j+1)/8
    assert scored == [-(j + 1) / 8 for j in range(len(context) - 1, n - 1)]
    assert all(max(top.values()) == lp for top, lp in zip(logprobs["top_logprobs"][1:-1],
                                                           logprobs["token_logprobs"][1:-1]))
    params = fake.submitted[0]["params"]
    assert (params.logprobs, params.prompt_logprobs, params.temperature) == (1, 1, 0.0)
    assert fake.submitted[0]["prompt_ids"] == context + continuation


async def test_echo_alone_echoes_the_text_and_asks_for_nothing(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    prompt_ids = ModelTokenizer.load(demo_model).encode_prompt("Good day")
    body = {"model": "demo", "prompt": prompt_ids, "max_tokens": 2, "echo": True}
    choice = (await post(AsyncClient(), "/v1/completions", body, api_key)).json()["choices"][0]
    tokenizer = ModelTokenizer.load(demo_model).tokenizer
    assert choice["text"] == tokenizer.decode(prompt_ids) + tokenizer.decode(TOKENS[:2])
    assert choice["logprobs"] is None
    assert not fake.submitted[0]["params"].scores


async def test_without_logprobs_nothing_is_asked(fake_pipeline, api_key):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS)})
    body = {"model": "demo", "messages": MESSAGES}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.json()["choices"][0]["logprobs"] is None
    assert fake.submitted[0]["params"].to_header() == {"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                                                       "seed": None}


async def test_a_resumed_request_does_not_score_its_prompt_again(fake_pipeline, api_key, demo_model):
    fake = fake_pipeline({"r0": Script(tokens=TOKENS, break_after=[3]), "r1": Script(tokens=TOKENS)})
    body = {"model": "demo", "prompt": "Hello", "max_tokens": 6, "logprobs": 1, "echo": True,
            "temperature": 0}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    logprobs = response.json()["choices"][0]["logprobs"]
    n = len(ModelTokenizer.load(demo_model).encode_prompt("Hello"))
    assert len(logprobs["tokens"]) == n + 6 and logprobs["token_logprobs"][0] is None
    assert [s["params"].prompt_logprobs for s in fake.submitted] == [1, None]
    assert [s["params"].logprobs for s in fake.submitted] == [1, 1]


@pytest.mark.parametrize(("path", "extra", "param"), [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"logprobs": 6}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"echo": "yes"}, "echo"),
])
async def test_bad_logprobs_fields_are_400s_naming_them(fake_pipeline, api_key, path, extra, param):
    fake_pipeline({"r0": Script(tokens=TOKENS)})
    base = {"model": "demo", "messages": MESSAGES} if "chat" in path else {"model": "demo", "prompt": "x"}
    response = await post(AsyncClient(), path, json.dumps({**base, **extra}), api_key)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == param
