"""lm-evaluation-harness through the gateway: its ``local-completions`` model scores a multiple-choice
task (written here, loaded from local files) on the live system's pipeline (conftest's ``live``), and
its accuracy equals that of the same task scored by transformers on the same checkpoint, each choice's
log-likelihood within the engine's tolerance."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

pytestmark = [pytest.mark.slow]

TASK = "motley_tiny_mc"
QUESTIONS = 20
ANSWER_PREFIX = "Answer:"


def write_task(folder) -> list[dict]:
    """A YAML task and its JSONL questions (sums with three answers) in ``folder``: the questions."""
    docs = [{"question": f"What is {a} plus {a + 3}?", "choices": [str(2 * a + 3), str(2 * a + 4), str(a)],
             "answer": a % 3} for a in range(1, QUESTIONS + 1)]
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    (folder / f"{TASK}.yaml").write_text(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
  cache_dir: {folder / "cache"}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\n{ANSWER_PREFIX}"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
  - metric: acc_norm
""")
    return docs


def transformers_scores(checkpoint, docs: list[dict]) -> list[list[float]]:
    """Each choice's log-likelihood after its question by transformers' LlamaForCausalLM: the tokens
    the answer adds to the question's (the text " <choice>", tokenized with the question, as lm_eval
    splits it), each one's log-softmax summed."""
    from transformers import LlamaForCausalLM

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(checkpoint, torch_dtype=torch.float32).eval()
    scores = []
    for doc in docs:
        context = f"Question: {doc['question']}\n{ANSWER_PREFIX}"
        start = len(tokenizer.encode(context, add_special_tokens=False).ids)
        row = []
        for choice in doc["choices"]:
            ids = tokenizer.encode(f"{context} {choice}", add_special_tokens=False).ids
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            row.append(sum(logp[i - 1, ids[i]].item() for i in range(start, len(ids))))
        scores.append(row)
    return scores


def accuracy(docs: list[dict], scores: list[list[float]]) -> tuple[float, float]:
    """acc (the likeliest choice is the answer) and acc_norm (the likeliest per character)."""
    acc = norm = 0
    for doc, row in zip(docs, scores):
        acc += max(range(len(row)), key=row.__getitem__) == doc["answer"]
        norm += max(range(len(row)), key=lambda j: row[j] / len(doc["choices"][j])) == doc["answer"]
    return acc / len(docs), norm / len(docs)


def test_lm_eval_through_the_gateway_scores_as_transformers(live, demo_model, tmp_path, monkeypatch):
    import lm_eval
    from lm_eval.tasks import TaskManager

    docs = write_task(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", live["key"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": "demo", "base_url": f"{live['base_url']}/completions",
                    "tokenizer_backend": "huggingface", "tokenizer": str(demo_model),
                    "tokenized_requests": True, "num_concurrent": 4, "max_retries": 1},
        tasks=[TASK], task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),
        log_samples=True, bootstrap_iters=0,
    )
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    served = [[float(ll) for ll, _greedy in s["filtered_resps"]] for s in samples]
    expected = transformers_scores(demo_model, docs)
    assert len(served) == QUESTIONS
    for got, want in zip(served, expected):
        assert got == pytest.approx(want, abs=2e-4)
    acc, acc_norm = accuracy(docs, expected)
    metrics = out["results"][TASK]
    assert (metrics["acc,none"], metrics["acc_norm,none"]) == (acc, acc_norm)
