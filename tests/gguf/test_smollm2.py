"""SmolLM2-135M-Instruct's GGUF file imported: logits, tokenizer and chat template as transformers' own
GGUF loader gives them for the same file.

Logits are compared at float32 (the import at ``dtype="float32"``, so the weights are exactly the
values transformers dequantizes: checked tensor by tensor). The 1e-4 bound is then about the import
(names, rotary permutation, config, tied head), not about storage rounding, when the stages compute
their linears with the same matmul as transformers (MKL's ``F.linear``): measured, prefill logits are
bit-identical and greedy-decode steps within 4e-5. On the engine's own kernels (an fp32 AVX2 kernel up
to 16 rows, oneDNN up to 32) summation order differs: on SmolLM2's logits of magnitude ~38 that is
up to 1.5e-4 measured, the size of transformers' own fp32 error against a float64 evaluation (9e-5);
that mode is checked at 3e-4.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from jinja2.sandbox import ImmutableSandboxedEnvironment
from safetensors.torch import load_file
from tokenizers import Tokenizer

import worker_runtime.dense as dense
from contracts.model_config import ModelConfig
from controlplane.models_catalog.gguf_import import import_gguf
from worker_runtime import Batch, SamplingParams, Stage, generate, run_stages

from .conftest import DECODE_STEPS

pytestmark = pytest.mark.slow  # converts and runs the real SmolLM2 checkpoint

TOLERANCE = 1e-4
OWN_KERNELS_TOLERANCE = 3e-4
LAYERS = 30
rng = random.Random(15)
PARTITIONS = {
    "whole": [(0, 30)],
    "thirds": [(0, 10), (10, 20), (20, 30)],
    "random-7": (lambda cuts: list(zip([0, *cuts], [*cuts, 30])))(sorted(rng.sample(range(1, 30), 6))),
    "one-per-layer": [(i, i + 1) for i in range(LAYERS)],  # the first and the last stage alone too
}


def check(references, model_dir, partition, tolerance):
    stages = [Stage.load(model_dir, start, end, kv_tokens=256, block_size=16) for start, end in partition]
    for seq, ref in enumerate(references):
        logits = run_stages(stages, Batch.of_tokens([seq], [ref.ids], [0]), all_logits=True)
        torch.testing.assert_close(logits, ref.prefill_logits, atol=tolerance, rtol=0)
        tokens = []
        for step in range(DECODE_STEPS):
            if step:
                logits = run_stages(stages, Batch.of_tokens([seq], [[tokens[-1]]], [len(ref.ids) + step - 1]))
            last = logits[-1]
            torch.testing.assert_close(last, ref.step_logits[step], atol=tolerance, rtol=0, msg=f"{step=}")
            tokens.append(int(last.argmax()))
        assert tokens == ref.tokens


def test_the_imported_weights_are_transformers_dequantized_weights(smollm2_fp32, hf_smollm2):
    ours = load_file(smollm2_fp32 / "model.safetensors")
    theirs = hf_smollm2.state_dict()
    assert set(theirs) - set(ours) == {"lm_head.weight"}  # tied: the embedding serves as the head
    for name, tensor in ours.items():
        assert torch.equal(tensor, theirs[name]), name


@pytest.mark.parametrize("partition", PARTITIONS.values(), ids=PARTITIONS.keys())
def test_logits_match_transformers_for_any_partition(smollm2_fp32, smollm2_references, partition,
                                                      monkeypatch):
    monkeypatch.setattr(dense, "KERNEL_MAX_ROWS", 0)  # every linear on F.linear, as transformers computes
    monkeypatch.setattr(dense, "ONEDNN_MAX_ROWS", 0)
    check(smollm2_references, smollm2_fp32, partition, TOLERANCE)


def test_logits_on_the_engines_own_kernels(smollm2_fp32, smollm2_references):
    check(smollm2_references, smollm2_fp32, PARTITIONS["thirds"], OWN_KERNELS_TOLERANCE)


def test_it_answers(smollm2_fp32, hf_smollm2_tokenizer):
    from .conftest import CHAT

    tokenizer = Tokenizer.from_file(str(smollm2_fp32 / "tokenizer.json"))
    prompt = tokenizer.encode(
        hf_smollm2_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    ).ids
    config = ModelConfig.from_file(smollm2_fp32)
    stages = [Stage.load(smollm2_fp32, 0, 15), Stage.load(smollm2_fp32, 15, 30)]
    [out] = generate(stages, [prompt], [SamplingParams(temperature=0)], 16, stop_tokens=config.eos_token_ids)
    assert "Paris" in tokenizer.decode(out) and out[-1] == 2  # stopped on <|im_end|>


def test_stop_tokens_are_recorded(smollm2_fp32):
    config = json.loads((smollm2_fp32 / "config.json").read_text())
    generation = json.loads((smollm2_fp32 / "generation_config.json").read_text())
    tokenizer = json.loads((smollm2_fp32 / "tokenizer_config.json").read_text())
    assert config["eos_token_id"] == generation["eos_token_id"] == [2, 0]  # <|im_end|>, <|endoftext|>
    assert ModelConfig.from_file(smollm2_fp32).eos_token_ids == (2, 0)
    assert (tokenizer["eos_token"], tokenizer["bos_token"], tokenizer["add_bos_token"]) == (
        "<|im_end|>", "<|im_start|>", False)
    assert (config["bos_token_id"], config["tie_word_embeddings"]) == (1, True)


TEXTS = [
    "Hello world", " leading space", "trailing space ", "  two  spaces\t\ttabs\n\nnew lines\r\n", "",
    "Ünïcödé — “quotes” 🙂 日本語のテキスト 한국어 العربية Ω≈ç√∫ ＡＢＣ e\u0301 a\u00a0b\u200bc",
    "12345 + 678 = 13023; 3.14159e-10", "don't won't I'M you'll", "def f(x):\n    return x**2  # c",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><repo_name>x<|im_end|>", "<|im_start|", "\n\n\n    \n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_the_tokenizer_encodes_as_transformers_and_round_trips(smollm2_fp32, hf_smollm2_tokenizer, text):
    ours = Tokenizer.from_file(str(smollm2_fp32 / "tokenizer.json"))
    ids = ours.encode(text, add_special_tokens=False).ids
    assert ids == hf_smollm2_tokenizer.encode(text, add_special_tokens=False)
    assert ours.decode(ids, skip_special_tokens=False) == text
    assert hf_smollm2_tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text
    # The file says add_bos_token = false: ours adds nothing (as llama.cpp); transformers' LLaMA
    # tokenizer adds its BOS whatever the file says.
    assert ours.encode(text).ids == ids
    assert hf_smollm2_tokenizer.encode(text) == [hf_smollm2_tokenizer.bos_token_id, *ids]


CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "Ünïcödé 🙂\nand more?"}],
]


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_the_chat_template_renders_as_transformers(
    smollm2_fp32, hf_smollm2_tokenizer, messages, generation_prompt
):
    config = json.loads((smollm2_fp32 / "tokenizer_config.json").read_text())
    # Rendered as transformers renders chat templates (its own Jinja2 settings).
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    text = environment.from_string(config["chat_template"]).render(
        messages=messages, add_generation_prompt=generation_prompt, bos_token=config["bos_token"],
        eos_token=config["eos_token"],
    )
    assert text == hf_smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )
    ours = Tokenizer.from_file(str(smollm2_fp32 / "tokenizer.json"))
    assert ours.encode(text, add_special_tokens=False).ids == hf_smollm2_tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation_prompt
    )


def test_the_gateway_renders_the_imported_template(smollm2_fp32, hf_smollm2_tokenizer):
    from controlplane.gateway.openai.tokenization import ModelTokenizer

    tokenizer = ModelTokenizer.load(smollm2_fp32)
    for messages in CONVERSATIONS:
        assert tokenizer.encode_chat(messages) == hf_smollm2_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True
        )


def test_float16_storage_is_the_float32_import_rounded(smollm2_gguf, smollm2_fp32, tmp_path):
    out = import_gguf(smollm2_gguf, tmp_path / "fp16")  # the default dtype
    half, full = load_file(out / "model.safetensors"), load_file(smollm2_fp32 / "model.safetensors")
    assert set(half) == set(full)
    for name, tensor in half.items():
        assert tensor.dtype == torch.float16 and torch.equal(tensor, full[name].half()), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float16"
