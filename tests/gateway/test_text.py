"""Tokenization, chat templates and the incremental detokenizer, on the demo checkpoint's tokenizer."""

from __future__ import annotations

import json

import pytest

from controlplane.gateway.openai.textstream import IncrementalDetokenizer, StopStrings
from controlplane.gateway.openai.tokenization import DEFAULT_CHAT_TEMPLATE, ChatTemplateError, ModelTokenizer

SAMPLES = ["Héllo wörld — 世界 🎉 ok", "naïve café ½ ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "plain ascii text", "🎉🎉🎉"]


@pytest.mark.parametrize("text", SAMPLES)
def test_streamed_pieces_join_to_the_full_decode_without_broken_characters(demo_model, text):
    tokenizer = ModelTokenizer.load(demo_model).tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(i) for i in ids] + [detokenizer.flush()]
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
    if not text.isascii():  # some tokens carried only part of a character, and were held back
        assert len(ids) > len([p for p in pieces if p])


def test_an_incomplete_character_at_the_end_comes_out_as_a_replacement(demo_model):
    tokenizer = ModelTokenizer.load(demo_model).tokenizer
    ids = tokenizer.encode("ok 🎉", add_special_tokens=False).ids[:-1]
    detokenizer = IncrementalDetokenizer(tokenizer)
    text = "".join(detokenizer.push(i) for i in ids) + detokenizer.flush()
    assert text == tokenizer.decode(ids) and text.endswith("\ufffd")


def test_special_tokens_are_not_shown(demo_model):
    tokenizer = ModelTokenizer.load(demo_model)
    detokenizer = IncrementalDetokenizer(tokenizer.tokenizer)
    assert detokenizer.push(tokenizer.eos_token_ids[0]) == "" and detokenizer.flush() == ""


@pytest.mark.parametrize(
    ("pieces", "stops", "sent", "stopped"),
    [
        (["Hello wo", "rld. Bye"], ("world",), "Hello ", True),
        (["ab", "c", "d"], ("xyz",), "ab", False),  # a tail of len("xyz") - 1 waits for more text
        (["a\n", "\nb"], ("\n\n",), "a", True),
        (["abc"], (), "abc", False),
    ],
)
def test_stop_strings_cut_and_hold_back_what_could_start_one(pieces, stops, sent, stopped):
    matcher = StopStrings(stops)
    out, done = "", False
    for piece in pieces:
        text, done = matcher.push(piece)
        out += text
        if done:
            break
    assert (out, done) == (sent, stopped)
    if not done:
        assert out + matcher.flush() == "".join(pieces)


def test_chat_uses_the_checkpoint_template_and_bos(demo_model):
    tokenizer = ModelTokenizer.load(demo_model)
    ids = tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    assert (tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
            == "<|begin_of_text|><|user|>Hi<|assistant|>")
    assert tokenizer.max_context == 256


def test_without_a_template_chatml_is_the_default(demo_model, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_text((demo_model / name).read_text())
    config = json.loads((demo_model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = ModelTokenizer.load(tmp_path)
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    text = tokenizer.tokenizer.decode(tokenizer.encode_chat([{"role": "user", "content": "Hi"}]))
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_templates_run_sandboxed_and_their_errors_are_refusals(demo_model, tmp_path):
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_text((demo_model / name).read_text())
    bad = "{{ messages.__class__.__mro__ }}{{ raise_exception('roles must alternate') }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": bad}))
    with pytest.raises(ChatTemplateError, match="unsafe|roles must alternate"):
        ModelTokenizer.load(tmp_path).encode_chat([{"role": "user", "content": "x"}])


def test_a_template_is_compiled_once_and_a_broken_one_refuses_every_time(demo_model, tmp_path):
    """The compiled template is kept per template text (the gateway renders on its event loop); a
    template that does not compile is refused at every request, not once."""
    from controlplane.gateway.openai import tokenization

    tokenizer = ModelTokenizer.load(demo_model)
    tokenizer.encode_chat([{"role": "user", "content": "Hi"}])
    compiled = tokenization._compiled.cache_info().currsize
    assert tokenizer.encode_chat([{"role": "user", "content": "Ho"}])
    assert tokenization._compiled.cache_info().currsize == compiled
    for name in ("tokenizer.json", "config.json"):
        (tmp_path / name).write_text((demo_model / name).read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    broken = ModelTokenizer.load(tmp_path)
    for _ in range(2):
        with pytest.raises(ChatTemplateError, match="refused"):
            broken.encode_chat([{"role": "user", "content": "x"}])
