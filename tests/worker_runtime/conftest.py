"""Tiny checkpoints and transformers' own outputs on them, made once per test session; torch's thread count
for the kernel tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from .checkpoints import VARIANTS, hf_model, make_checkpoint

PROMPT_LEN = 11
DECODE_STEPS = 32


@dataclass
class Reference:
    path: Path
    num_layers: int
    prompt: list[int]
    prefill_logits: torch.Tensor  # [prompt, vocab], transformers' forward on the prompt
    step_logits: torch.Tensor  # [1 + DECODE_STEPS, vocab], transformers' generate (greedy, with its KV cache)
    greedy_tokens: list[int]  # 1 + DECODE_STEPS tokens


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: make_checkpoint(name, root / name) for name in VARIANTS}


@pytest.fixture(scope="session")
def references(checkpoints) -> dict[str, Reference]:
    return {name: reference(path) for name, path in checkpoints.items()}


# 16-bit checkpoints: tied embeddings, biases with untied head, weights of 1-4 MiB (our kernels' sizes).
VARIANTS_16BIT = ("llama_dynamic_tied", "qwen2_bias", "llama_wide")


@pytest.fixture(scope="session")
def checkpoints_16bit(tmp_path_factory) -> dict[str, Path]:
    """``VARIANTS_16BIT`` saved in fp16 and bf16, named "<variant>-<float16|bfloat16>"."""
    root = tmp_path_factory.mktemp("checkpoints_16bit")
    names = {f"{v}-{str(d).removeprefix('torch.')}": (v, d) for v in VARIANTS_16BIT
             for d in (torch.float16, torch.bfloat16)}
    return {name: make_checkpoint(v, root / name, dtype=d) for name, (v, d) in names.items()}


def reference(path: Path) -> Reference:
    """transformers' fp32 outputs on the checkpoint at ``path`` (16-bit weights widened as it loads)."""
    model = hf_model(path)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, model.config.vocab_size, (PROMPT_LEN,), generator=generator)
    ids = prompt[None]
    with torch.no_grad():
        prefill = model(ids).logits[0]
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=1 + DECODE_STEPS,
            min_new_tokens=1 + DECODE_STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return Reference(
        path=path,
        num_layers=model.config.num_hidden_layers,
        prompt=prompt.tolist(),
        prefill_logits=prefill,
        step_logits=torch.cat(out.logits),
        greedy_tokens=out.sequences[0, PROMPT_LEN:].tolist(),
    )


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    """torch's thread count (which the CPU kernels take as their team size), restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
