"""Log-probabilities through real stage processes, against transformers' log-softmax of the same
16-bit checkpoint: the sampled tokens' and, from the prefill's own logit rows, the prompt's."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaForCausalLM

from contracts.sampling import SamplingParams
from controlplane.gateway.serving.pipeline_client import PipelineClient

from .conftest import make_tiny_llama
from .harness import TOKEN, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes

# the engine's 1e-4 on logits (tests/worker_runtime/test_parity.py), twice through log-softmax
TOLERANCE = 2e-4
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6, 7, 40, 41, 42, 5, 6]  # repeats: prompt lookup would propose


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    path = make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-bf16", seed=3)
    model = LlamaForCausalLM.from_pretrained(path)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    return path


def reference(path, tokens: list[int]) -> torch.Tensor:
    """transformers' log-softmax over ``tokens`` (fp32 compute, the 16-bit weights widened)."""
    model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].float(), dim=-1)


def check(entry, logp_row: torch.Tensor, token: int, top: int) -> None:
    assert entry.logprob == pytest.approx(logp_row[token].item(), abs=TOLERANCE)
    assert len(entry.top) == top
    values, ids = logp_row.topk(top)
    assert [lp for _, lp in entry.top] == pytest.approx(values.tolist(), abs=TOLERANCE)
    assert [t for t, _ in entry.top][:1] == ids.tolist()[:1]  # the best; near-ties may swap below it


async def run(client, params: SamplingParams, max_tokens: int = 6) -> list:
    return [e async for e in client.submit(PROMPT, params, max_tokens=max_tokens)]


@pytest.mark.parametrize("num_stages", [1, 3])
async def test_logprobs_match_transformers_and_change_no_token(bf16_model, tmp_path, num_stages):
    from .conftest import launcher

    with launcher(bf16_model, tmp_path) as start:
        pipeline = start(num_stages, speculation="lookup", prefix_caching=True)
        async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
            assert (await wait_healthy(client))["ok"]
            plain = await run(client, SamplingParams())
            scored = await run(client, SamplingParams(logprobs=3, prompt_logprobs=2))
            again = await run(client, SamplingParams(logprobs=0, prompt_logprobs=4))  # its prefix is cached
            seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
            sampled = await run(client, seeded)
            sampled_scored = await run(client, replace(seeded, logprobs=1))
    tokens = [e.token_id for e in plain]
    assert [e.token_id for e in scored] == [e.token_id for e in again] == tokens
    assert all(e.logprobs is None for e in plain + sampled)
    logp = reference(bf16_model, PROMPT + tokens)
    first = scored[0].logprobs
    assert len(first.prompt) == len(PROMPT) - 1
    for i, entry in enumerate(first.prompt):  # the prompt's token i + 1, scored by row i
        check(entry, logp[i], PROMPT[i + 1], 2)
    for j, event in enumerate(scored):
        check(event.logprobs.token, logp[len(PROMPT) - 1 + j], event.token_id, 3)
        assert j == 0 or event.logprobs.prompt is None
    assert [e.logprob for e in again[0].logprobs.prompt] == pytest.approx([e.logprob for e in first.prompt],
                                                                          abs=TOLERANCE)
    assert all(e.logprobs.token.top == () for e in again)
    # Sampling draws the same tokens with or without log-probabilities, which are the model's own (raw)
    assert [e.token_id for e in sampled_scored] == [e.token_id for e in sampled]
    logp = reference(bf16_model, PROMPT + [e.token_id for e in sampled])
    for j, event in enumerate(sampled_scored):
        check(event.logprobs.token, logp[len(PROMPT) - 1 + j], event.token_id, 1)
