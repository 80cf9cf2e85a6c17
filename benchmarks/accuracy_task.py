"""A multiple-choice task scored two ways: by lm-evaluation-harness (``lm_eval``) through motley's
gateway, and by transformers on the same checkpoint, the reference the first is checked against
(tests/gateway/test_live_lmeval.py) and compared with (benchmarks/accuracy_bench.py).

The task is benchmarks/tasks/motley_mc's shape: JSONL rows ``{"question", "choices", "answer"}`` and
the prompt ``Question: <question>\\nAnswer:``. Each choice is scored as lm_eval scores a
``multiple_choice`` task: the text ``" <choice>"`` after the prompt, tokenized with it (no special
tokens), its tokens being those past the prompt's own; their log-softmax summed is the choice's
log-likelihood. ``acc``: the likeliest choice is the answer; ``acc_norm``: the likeliest per
character of the choice.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

TASKS = Path(__file__).resolve().parent / "tasks"
TASK = "motley_mc"


def task_config(name: str = TASK) -> dict:
    """The shipped task's YAML as a dict (tests write a copy with their own questions)."""
    return yaml.safe_load((TASKS / name / f"{name}.yaml").read_text())


def prompt_of(doc: dict) -> str:
    return f"Question: {doc['question']}\nAnswer:"


def read_docs(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def lm_eval_through_gateway(base_url: str, model: str, tokenizer: Path, task_dir: Path, task: str = TASK,
                            *, concurrent: int = 4, limit: int | None = None) -> dict:
    """``lm_eval.simple_evaluate`` of ``task`` (its YAML in ``task_dir``, and only it: no built-in task
    indexed) with the ``local-completions`` model on ``base_url`` (``.../v1``) serving ``model``:
    token-id prompts (lm_eval splits context and choice with the model's own ``tokenizer``, a local
    checkpoint directory) and ``concurrent`` requests at a time; its samples logged; ``limit``: its first
    so many questions only. The API key is
    ``OPENAI_API_KEY``'s, where local-completions reads it."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"model": model, "base_url": f"{base_url}/completions", "tokenizer_backend": "huggingface",
                    "tokenizer": str(tokenizer), "tokenized_requests": True, "num_concurrent": concurrent,
                    "max_retries": 1},
        tasks=[task], task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
        log_samples=True, bootstrap_iters=0, limit=limit,
    )


def served_logliks(out: dict, task: str = TASK) -> list[list[float]]:
    """Each choice's log-likelihood in lm_eval's logged samples, in the questions' order."""
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [[float(ll) for ll, _greedy in s["filtered_resps"]] for s in samples]


def choice_logliks(checkpoint: Path, docs: list[dict]) -> list[list[float]]:
    """Each choice's log-likelihood by transformers' LlamaForCausalLM on ``checkpoint``, computing in
    fp32 (a 16-bit checkpoint's weights widened, as a CPU stage of motley computes). A question's
    choices go in one forward pass, padded at the end: causal attention keeps every position before
    the padding as it is alone."""
    import torch
    from tokenizers import Tokenizer
    from transformers import LlamaForCausalLM

    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    model = LlamaForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def ids_of(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    scores = []
    for doc in docs:
        context = prompt_of(doc)
        start = len(ids_of(context))
        rows = [ids_of(f"{context} {choice}") for choice in doc["choices"]]
        width = max(map(len, rows))
        with torch.no_grad():
            logits = model(torch.tensor([ids + [0] * (width - len(ids)) for ids in rows])).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        scores.append([sum(logp[r, i - 1, ids[i]].item() for i in range(start, len(ids)))
                       for r, ids in enumerate(rows)])
    return scores


def accuracy(docs: list[dict], scores: list[list[float]]) -> dict[str, float]:
    """``acc`` and ``acc_norm`` of the choices' log-likelihoods, as lm_eval computes them."""
    acc = norm = 0
    for doc, row in zip(docs, scores):
        choices = range(len(row))
        acc += max(choices, key=row.__getitem__) == doc["answer"]
        norm += max(choices, key=lambda j: row[j] / len(doc["choices"][j])) == doc["answer"]
    return {"acc": acc / len(docs), "acc_norm": norm / len(docs)}
