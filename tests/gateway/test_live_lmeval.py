"""lm-evaluation-harness through the gateway: its ``local-completions`` model scores a multiple-choice
task (the shipped benchmarks/tasks/motley_mc's YAML, with questions written here) on the live system's
pipeline (conftest's ``live``), and its accuracy equals that of the same task scored by transformers on
the same checkpoint (benchmarks/accuracy_task.py), each choice's log-likelihood within the engine's
tolerance."""

from __future__ import annotations

import json

import pytest
import yaml

from benchmarks.accuracy_task import (
    accuracy,
    choice_logliks,
    lm_eval_through_gateway,
    served_logliks,
    task_config,
)

pytestmark = [pytest.mark.slow]

TASK = "motley_tiny_mc"


def write_task(folder) -> list[dict]:
    """The shipped task's YAML, renamed and pointed at 20 questions of its own (sums, three answers)."""
    docs = [{"question": f"What is {a} plus {a + 3}?", "choices": [str(2 * a + 3), str(2 * a + 4), str(a)],
             "answer": a % 3} for a in range(1, 21)]
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    config = task_config() | {"task": TASK, "dataset_kwargs": {
        "data_files": {"test": str(data)}, "cache_dir": str(folder / "cache")}}
    (folder / f"{TASK}.yaml").write_text(yaml.safe_dump(config))
    return docs


def test_lm_eval_through_the_gateway_scores_as_transformers(live, demo_model, tmp_path, monkeypatch):
    docs = write_task(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", live["key"])
    out = lm_eval_through_gateway(live["base_url"], "demo", demo_model, tmp_path, TASK)
    served, expected = served_logliks(out, TASK), choice_logliks(demo_model, docs)
    assert len(served) == len(docs)
    for got, want in zip(served, expected):
        assert got == pytest.approx(want, abs=2e-4)
    metrics = out["results"][TASK]
    assert {"acc": metrics["acc,none"], "acc_norm": metrics["acc_norm,none"]} == accuracy(docs, expected)
