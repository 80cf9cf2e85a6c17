"""Generation stops on every end token a checkpoint declares: the tokenizer's ``eos_token`` and the
``eos_token_id`` list of config.json / generation_config.json (SmolLM2: <|im_end|> and <|endoftext|>)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from django.test import AsyncClient

from controlplane.gateway.openai.tokenization import ModelTokenizer
from tests.gateway.fakes import FakePipelineClient, Script

pytestmark = pytest.mark.django_db(transaction=True)


def with_eos(source: Path, out: Path, config_eos, generation_eos=None) -> Path:
    """A copy of ``source`` whose config.json (and, if given, generation_config.json) name these ids."""
    shutil.copytree(source, out)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "eos_token_id": config_eos}))
    if generation_eos is not None:
        (out / "generation_config.json").write_text(json.dumps({"eos_token_id": generation_eos}))
    return out


@pytest.fixture(scope="module")
def ids(demo_model) -> dict[str, int]:
    tokenizer = ModelTokenizer.load(demo_model).tokenizer
    return {t: tokenizer.token_to_id(t) for t in ("<|end_of_text|>", "<|user|>", "<|assistant|>")}


def test_the_models_eos_list_is_merged_with_the_tokenizers_eos(demo_model, tmp_path, ids):
    eos, user, assistant = ids["<|end_of_text|>"], ids["<|user|>"], ids["<|assistant|>"]
    assert ModelTokenizer.load(demo_model).eos_token_ids == (eos,)
    listed = with_eos(demo_model, tmp_path / "listed", [user, eos])
    assert ModelTokenizer.load(listed).eos_token_ids == (eos, user)  # the tokenizer's first, no repeats
    both = with_eos(demo_model, tmp_path / "both", user, [assistant, user])
    assert ModelTokenizer.load(both).eos_token_ids == (eos, user, assistant)
    odd = with_eos(demo_model, tmp_path / "odd", [True, "x", None, user])
    assert ModelTokenizer.load(odd).eos_token_ids == (eos, user)  # only integers are token ids


@pytest.mark.parametrize("stop_on", ["<|end_of_text|>", "<|user|>"])
async def test_generation_stops_on_either_end_token_with_finish_reason_stop(
    fake_pipeline, api_key, demo_model, tmp_path, ids, stop_on
):
    model = with_eos(demo_model, tmp_path / "two-eos", [ids["<|end_of_text|>"], ids["<|user|>"]])
    tokenizer = ModelTokenizer.load(model)
    text = tokenizer.encode_prompt("Hello world")
    fake_pipeline({})
    FakePipelineClient.reset(str(model), {"r0": Script(tokens=[*text, ids[stop_on], *text])})
    body = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50}
    response = await AsyncClient().post("/v1/chat/completions", json.dumps(body),
                                        content_type="application/json",
                                        headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["choices"][0]["message"]["content"] == "Hello world"
    assert data["choices"][0]["finish_reason"] == "stop"
    assert data["usage"]["completion_tokens"] == len(text) + 1  # the end token counts, nothing after it
    assert FakePipelineClient.submitted[0]["stop_token_ids"] == (ids["<|end_of_text|>"], ids["<|user|>"])
