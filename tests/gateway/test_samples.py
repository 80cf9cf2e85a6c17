"""``n`` > 1 against stand-in replicas: OpenAI's shapes (choices 0..n-1, streamed chunks naming their
choice), usage counting the prompt once, the bound, each sample's seed, and the later samples submitted
to the first's replica only after its first token (so the head's prefix cache serves them the prompt)."""

from __future__ import annotations

import asyncio

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.protocol import MAX_SAMPLES
from controlplane.gateway.openai.samples import sample_seed
from tests.gateway.fakes import Script
from tests.gateway.test_views import TEXT, post, sse_events, streaming, tokens

pytestmark = pytest.mark.django_db(transaction=True)


def test_sample_seeds_are_the_requests_first_then_derived_and_none_stays_none():
    assert sample_seed(7, 0) == 7 and sample_seed(None, 3) is None
    seeds = [sample_seed(7, i) for i in range(MAX_SAMPLES)]
    assert len(set(seeds)) == MAX_SAMPLES and all(0 <= s < 2**63 for s in seeds[1:])
    assert seeds == [sample_seed(7, i) for i in range(MAX_SAMPLES)]


async def test_n_completions_share_one_replica_after_the_first_token(fake_pipeline, api_key, demo_model):
    out = tokens(demo_model)
    fake = fake_pipeline({"r0": Script(tokens=out, delay_s=0.01), "r1": Script(tokens=out, delay_s=0.01)})
    body = {"model": "demo", "prompt": "The quick brown fox", "max_tokens": 50, "n": 3, "seed": 11}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    data = response.json()
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert all(c["text"] == TEXT and c["finish_reason"] == "length" for c in data["choices"])
    prompt = len(tokens(demo_model, "The quick brown fox"))
    assert data["usage"] == {"prompt_tokens": prompt, "completion_tokens": 3 * len(out),
                             "total_tokens": prompt + 3 * len(out)}
    first, *later = fake.submitted
    assert len({s["pipeline_id"] for s in fake.submitted}) == 1
    assert len({s["request_id"] for s in fake.submitted}) == 3
    assert all(s["at"] >= first["first_token_at"] for s in later)
    assert [s["params"].seed for s in fake.submitted] == [sample_seed(11, i) for i in range(3)]


async def test_unseeded_samples_draw_their_own_randomness(fake_pipeline, api_key):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6])})
    body = {"model": "demo", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2,
            "temperature": 1.0}
    response = await post(AsyncClient(), "/v1/chat/completions", body, api_key)
    assert response.status_code == 200, response.content
    assert [c["index"] for c in response.json()["choices"]] == [0, 1]
    assert [s["params"].seed for s in fake.submitted] == [None, None]


async def test_streamed_chat_chunks_name_their_choice_and_usage_counts_all(fake_pipeline, api_key,
                                                                           demo_model):
    out = tokens(demo_model, "Hi there")
    fake_pipeline({"r0": Script(tokens=out, delay_s=0.005)})
    body = {"model": "demo", "messages": [{"role": "user", "content": "Hello"}], "n": 2, "stream": True,
            "max_tokens": 20, "stream_options": {"include_usage": True}}
    events = await sse_events(await post(AsyncClient(), "/v1/chat/completions", body, api_key))
    assert [e["choices"][0] for e in events[:2]] == [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(2)]
    chunks = [e["choices"][0] for e in events[2:-1]]
    assert all(len(e["choices"]) == 1 for e in events[2:-1])
    for index in range(2):
        mine = [c for c in chunks if c["index"] == index]
        assert "".join(c["delta"]["content"] for c in mine) == "Hi there"
        assert [c["finish_reason"] for c in mine][-1] == "length"
        assert sum(c["finish_reason"] is not None for c in mine) == 1
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 2 * len(out)


async def test_echo_with_logprobs_scores_the_prompt_once_and_echoes_it_in_every_choice(fake_pipeline,
                                                                                        api_key):
    fake = fake_pipeline({"r0": Script(tokens=[5, 6])})
    body = {"model": "demo", "prompt": [1, 2, 3], "max_tokens": 2, "n": 2, "echo": True, "logprobs": 1}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 200, response.content
    choices = response.json()["choices"]
    assert choices[0]["logprobs"]["tokens"][:3] == choices[1]["logprobs"]["tokens"][:3]
    assert choices[0]["logprobs"]["token_logprobs"][:3] == choices[1]["logprobs"]["token_logprobs"][:3]
    assert [s["params"].prompt_logprobs for s in fake.submitted] == [1, None]


@pytest.mark.parametrize(("n", "message"), [
    (MAX_SAMPLES + 1, f"at most {MAX_SAMPLES}"), (0, "at least 1"), ("2", "integer"), (True, "integer"),
])
async def test_n_out_of_bounds_is_a_400_naming_the_bound(fake_pipeline, api_key, n, message):
    fake = fake_pipeline({"r0": Script(tokens=[5])})
    body = {"model": "demo", "prompt": "x", "n": n}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "n" and message in error["message"]
    assert not fake.submitted


async def test_a_client_that_goes_away_cancels_every_sample(fake_pipeline, api_key):
    fake = fake_pipeline({"r0": Script(tokens=list(range(5, 200)), delay_s=0.01)})
    body = {"model": "demo", "prompt": "x", "max_tokens": 150, "n": 3, "stream": True}
    response = await post(AsyncClient(), "/v1/completions", body, api_key)
    task, received = streaming(response)
    while len(fake.submitted) < 3 or len(received) < 6:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(fake.cancelled) == sorted(s["request_id"] for s in fake.submitted)
