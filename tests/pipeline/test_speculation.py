"""Speculative decoding through a pipeline (docs/pipeline.md, "Speculative decoding"): the real head and
relay loops in one process (in_process.py).

Greedy output is the same with speculation on and off and as one in-process model decodes it, at every
precision and with several stages; seeded sampling is the same token for token; unseeded sampling
draws from the target model's distribution (a chi-square test against its exact probabilities); a
request may opt out; stop tokens and max_tokens end a verified step where they would end decoding.
The head's step cost is fixed as a latency-bound pipeline's (``latency_bound``), so the policy
proposes whatever may be accepted (its judgement: tests/worker_runtime/test_speculation_policy.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from contracts.precision import Precision
from contracts.sampling import SamplingParams
from worker_runtime.chain import generate
from worker_runtime.prompt_lookup import PromptLookup
from worker_runtime.sampling import _filtered_logits
from worker_runtime.stage import Batch, Stage

from .conftest import NUM_LAYERS
from .in_process import InProcessPipeline

pytestmark = pytest.mark.usefixtures("latency_bound")
QUOTED = [(i * 11) % 200 + 3 for i in range(24)]
# A text to repeat (lookup-friendly: the output copies the prompt), an open-ended prompt, and a prompt
# whose greedy continuation of the tiny model falls into a loop the lookup then predicts.
PROMPTS = [QUOTED + [1] + QUOTED[:6], [(i * 37) % 250 + 1 for i in range(9)], [5, 6, 7]]


def jobs(max_tokens: int = 24, **more) -> list[tuple]:
    return [(prompt, max_tokens, more) for prompt in PROMPTS]


def reference(model, pipeline, prompts_and_lengths, bits: int) -> list[list[int]]:
    torch.set_num_threads(1)
    stages = [Stage.load(model, *spec.layers, precision=Precision(bits), kv_tokens=1024)
              for spec in pipeline.specs]
    return [generate(stages, [prompt], max_new_tokens=n)[0] for prompt, n, *_ in prompts_and_lengths]


@pytest.mark.parametrize("bits,num_stages", [(16, 3), (8, 2), (4, 3)])
def test_greedy_output_is_the_same_with_speculation_on_and_off(tiny_model, bits, num_stages):
    speculating = InProcessPipeline(tiny_model, NUM_LAYERS, num_stages, bits=bits, kv_tokens=512,
                                    speculation="lookup", speculative_tokens=6)
    plain = InProcessPipeline(tiny_model, NUM_LAYERS, num_stages, bits=bits, kv_tokens=512)
    outputs = speculating.run(jobs())  # together: verifications share micro-batches with plain steps
    assert outputs == plain.run(jobs()) == reference(tiny_model, plain, jobs(), bits)

    figures = speculating.head.own_stats()
    assert figures["spec_drafts"] > 0 and figures["spec_accepted_tokens"] > 0
    assert figures["spec_accepted_tokens"] <= figures["spec_draft_tokens"]
    assert "spec_drafts" not in plain.head.own_stats()
    # every stage's cache is empty again: rolled-back proposals left no block behind
    assert all(stage.kv.free_tokens + stage.kv.evictable_blocks * 16 == 512 for stage in speculating.stages)


def test_seeded_sampling_is_the_same_token_for_token(tiny_model):
    speculating = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=512, speculation="lookup")
    plain = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=512)
    seeded = [(prompt, 20, {"sampling": {"temperature": 0.7, "top_p": 0.9, "seed": seed}})
              for seed, prompt in enumerate(PROMPTS * 2)]
    assert speculating.run(seeded) == plain.run(seeded)
    assert speculating.head.own_stats()["spec_drafts"] > 0


def test_a_request_that_opts_out_carries_no_proposals(tiny_model):
    pipeline = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=512, speculation="lookup")
    out = pipeline.run(jobs(speculate=False))
    assert pipeline.head.own_stats()["spec_drafts"] == 0
    assert out == pipeline.run(jobs()) and pipeline.head.own_stats()["spec_drafts"] > 0
    pipeline.head.on_submit(b"client", {"request_id": "bad", "prompt": [1, 2], "max_tokens": 2,
                                        "speculate": "no"})
    assert pipeline.replies[-1]["kind"] == "rejected" and "speculate" in pipeline.replies[-1]["message"]


def test_stop_tokens_and_max_tokens_end_a_verified_step(tiny_model):
    speculating = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=512, speculation="lookup")
    plain = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=512)
    full = plain.run(jobs(max_tokens=30))
    # stop at each output's 12th token: a token the verified steps around it would emit further
    stops = [(prompt, 30, {"stop_token_ids": [out[11]]}) for prompt, out in zip(PROMPTS, full)]
    for max_tokens in (1, 2, 3, 17):
        assert speculating.run(jobs(max_tokens)) == [out[:max_tokens] for out in full]
    ended = speculating.run(stops)
    assert ended == plain.run(stops)
    assert all(out[-1] == stop[2]["stop_token_ids"][0] and len(out) <= 12 for out, stop in zip(ended, stops))


def test_unseeded_sampling_draws_from_the_target_distribution(tiny_model, monkeypatch):
    """The first decode step verifies a proposal of the tiny model's likeliest path; the joint
    distribution of the three tokens (top_k 2: eight outcomes) matches the model's exact one."""
    torch.manual_seed(0)
    prompt, params = [17, 42, 99, 3, 250, 61], SamplingParams(temperature=1.0, top_k=2)
    stage = Stage.load(tiny_model, 0, NUM_LAYERS, kv_tokens=64)

    def distribution(prefix: list[int]) -> torch.Tensor:
        batch = Batch.of_tokens([0], [prefix], [0])
        logits = stage.forward(batch)
        stage.kv.free(0)
        return _filtered_logits(logits, [params]).softmax(-1)[0]

    first = distribution(prompt)
    likely = int(first.argmax())
    proposal = int(distribution(prompt + [likely]).argmax())
    monkeypatch.setattr(PromptLookup, "propose", lambda self, tokens, k: [proposal] * min(k, 1))
    exact = {}
    for a in first.topk(2).indices.tolist():
        second = distribution(prompt + [a])
        for b in second.topk(2).indices.tolist():
            third = distribution(prompt + [a, b])
            for c in third.topk(2).indices.tolist():
                exact[(a, b, c)] = float(first[a] * second[b] * third[c])

    pipeline = InProcessPipeline(tiny_model, NUM_LAYERS, 2, kv_tokens=4096, speculation="lookup")
    samples, job = 600, (prompt, 3, {"sampling": {"temperature": 1.0, "top_k": 2}})
    # two at a time: at batch 1 or 2 a proposal pays, where hundreds of sequences would not make it
    drawn = [out for _ in range(samples // 2) for out in pipeline.run([job, job])]
    figures = pipeline.head.own_stats()
    assert figures["spec_accepted_tokens"] > samples // 10  # the proposal was accepted often
    counts = {outcome: 0 for outcome in exact}
    for out in drawn:
        counts[tuple(out)] += 1
    chi2 = sum((counts[o] - samples * p) ** 2 / (samples * p) for o, p in exact.items())
    # 7 degrees of freedom: P(chi2 > 24.3) = 0.001
    assert chi2 < 24.3, (chi2, counts, exact)
    assert math.isclose(sum(exact.values()), 1.0, rel_tol=1e-4)
