"""The cuda paths: stages on a GPU (packed int8/int4 kernels packed on the device) against the CPU fp32
stage, and against transformers on the same GPU at fp16/bf16, int8 and int4; skipped where there is
no GPU. `benchmarks/gpu_check.py` runs this file first thing when a GPU machine is lent.

Parity with transformers: 16 prompts of 32 tokens prefilled in one ragged batch (logits of every
position), then 8 decode steps of all 16 sequences together, teacher-forced with fixed tokens, each
step's logits against transformers' forward over the whole sequence. Errors are normalized by the
std of transformers' logits, as in test_quantization.py, whose CPU bounds (int8 max 0.15 / mean 0.025
/ agreement 0.93, int4 1.5 / 0.27 / 0.48) the quantized bounds below loosen a little: no GPU has
run this file yet, so they are first guesses to be tightened from the figures it prints. With
``MOTLEY_PARITY_RECORD=FILE`` each case appends its figures to FILE as one JSON line.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from contracts.precision import Precision
from worker_runtime import Batch, Stage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = "cuda:0"
LAYERS = 4
PROMPTS, PROMPT_LEN, DECODE_STEPS = 16, 32, 8
# (bits, our dtype, transformers' dtype): (max error / std, mean error / std, min next-token agreement)
PARITY = {
    (16, torch.float16, torch.float16): (0.05, 0.005, 0.97),
    (16, torch.bfloat16, torch.bfloat16): (0.15, 0.03, 0.85),
    (8, torch.float16, torch.float16): (0.2, 0.035, 0.9),
    (8, torch.bfloat16, torch.bfloat16): (0.25, 0.04, 0.85),
    (4, torch.float16, torch.float16): (1.8, 0.32, 0.45),
}


@pytest.fixture(scope="module")
def demo_small(tmp_path_factory):
    from worker_runtime.make_demo_model import parse_args, write_demo_model

    out = tmp_path_factory.mktemp("demo_cuda")
    shape = [
        "--layers",
        str(LAYERS),
        "--hidden",
        "256",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--intermediate",
        "512",
    ]
    write_demo_model(parse_args([str(out), *shape]))
    return out


@pytest.mark.parametrize(
    "bits,dtype,bound",
    [(16, torch.float32, 1e-3), (16, torch.bfloat16, 0.1), (8, None, 0.1), (4, torch.bfloat16, 1.5)],
)
def test_cuda_stage_matches_the_cpu_fp32_stage(demo_small, bits, dtype, bound):
    prompts = [list(range(4, 30)), list(range(100, 107))]
    batch = Batch.of_tokens([0, 1], prompts, [0, 0])
    reference = Stage.load(demo_small, 0, LAYERS).forward(batch, all_logits=True)
    stage = Stage.load(demo_small, 0, LAYERS, device=CUDA, dtype=dtype, precision=Precision(bits))
    logits = stage.forward(batch, all_logits=True).cpu()
    assert ((logits - reference).abs().max() / reference.std()) < bound
    assert stage.memory().weight_bytes > 0 and stage.kv.k.is_cuda


@pytest.fixture(scope="module")
def tokens():
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, 700, (PROMPTS, PROMPT_LEN), generator=generator).tolist()
    forced = torch.randint(4, 700, (PROMPTS, DECODE_STEPS), generator=generator).tolist()
    return prompts, forced


@pytest.fixture(scope="module")
def transformers_logits(demo_small, tokens):
    """transformers' logits of every position of prompt + forced tokens, per dtype, on the GPU."""
    transformers = pytest.importorskip("transformers")
    prompts, forced = tokens
    ids = torch.tensor([p + f for p, f in zip(prompts, forced)], device=CUDA)
    cache: dict[torch.dtype, torch.Tensor] = {}

    def logits(dtype: torch.dtype) -> torch.Tensor:
        if dtype not in cache:
            model = transformers.AutoModelForCausalLM.from_pretrained(demo_small, dtype=dtype).to(CUDA).eval()
            with torch.inference_mode():
                cache[dtype] = model(ids, attention_mask=torch.ones_like(ids)).logits.float().cpu()
            del model
            torch.cuda.empty_cache()
        return cache[dtype]

    return logits


def our_logits(stage: Stage, prompts: list[list[int]], forced: list[list[int]]) -> torch.Tensor:
    """Prefill every prompt in one ragged batch, then decode the forced tokens of all sequences together:
    logits [sequences, prompt + steps, vocab], comparable with a forward over the whole sequence."""
    ids = list(range(len(prompts)))
    prefill = stage.forward(Batch.of_tokens(ids, prompts, [0] * len(prompts)), all_logits=True).cpu()
    steps = []
    for k in range(DECODE_STEPS):
        batch = Batch.of_tokens(ids, [[f[k]] for f in forced], [len(p) + k for p in prompts])
        steps.append(stage.forward(batch).cpu())
    prefill = prefill.view(len(prompts), PROMPT_LEN, -1)
    return torch.cat([prefill, torch.stack(steps, dim=1)], dim=1)


@pytest.mark.parametrize("bits,dtype,hf_dtype", list(PARITY), ids=lambda v: str(v).removeprefix("torch."))
def test_cuda_stage_matches_transformers_on_the_same_gpu(
    demo_small, tokens, transformers_logits, bits, dtype, hf_dtype
):
    prompts, forced = tokens
    reference = transformers_logits(hf_dtype)
    stage = Stage.load(demo_small, 0, LAYERS, device=CUDA, dtype=dtype, precision=Precision(bits),
                        kv_tokens=1024)
    ours = our_logits(stage, prompts, forced)
    error = (ours - reference).abs() / reference.std()
    agreement = (ours.argmax(-1) == reference.argmax(-1)).float().mean().item()
    decode_error = error[:, PROMPT_LEN:].max().item()
    figures = {
        "case": f"int{bits}" if bits < 16 else str(dtype).removeprefix("torch."),
        "reference": f"transformers {str(hf_dtype).removeprefix('torch.')} on {torch.cuda.get_device_name()}",
        "max": error.max().item(),
        "mean": error.mean().item(),
        "agreement": agreement,
        "decode_max": decode_error,
        "bounds": PARITY[(bits, dtype, hf_dtype)],
    }
    print(json.dumps(figures))
    if record := os.environ.get("MOTLEY_PARITY_RECORD"):
        with open(record, "a") as out:
            out.write(json.dumps(figures) + "\n")
    max_bound, mean_bound, min_agreement = PARITY[(bits, dtype, hf_dtype)]
    assert error.max() <= max_bound and error.mean() <= mean_bound and agreement >= min_agreement, figures
    assert all(kv.is_cuda for kv in (stage.kv.k, stage.kv.v))
