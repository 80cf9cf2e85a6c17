"""Per-request work the ASGI server does outside the pipeline, each against its baseline in one run.

    .venv/bin/python benchmarks/request_overhead_bench.py [--model var/models/SmolLM2-135M-Instruct]
        [--repeat 300]

- **Chat template**: a chat request's prompt is rendered from the model's Jinja2 template on the
  server's event loop. Baseline: compiled at every request (the uncached ``tokenization._compiled``);
  now: compiled once per template and rendered. ChatML always, and the template of ``--model`` (a
  checkpoint directory, e.g. the SmolLM2 that ``make run`` imports) when it exists.
- **Celery's result backend**: an API request that sends a task (an apply, a drain) runs in a thread
  of its own under ASGI. Baseline: the backend built for that thread (what Celery does for a backend
  it may not share: ``app._get_backend()``); now: the one backend every thread shares
  (``CELERY_RESULT_BACKEND_THREAD_SAFE``), read from a new thread.

Baseline and now run in turn, round after round (``kernel_bench.interleaved_seconds``), so load from
other processes falls on both alike. Prints the median time of each, side by side, and baseline over
now. Not in CI.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

import django  # noqa: E402

django.setup()

from benchmarks.kernel_bench import interleaved_seconds  # noqa: E402
from controlplane.celery import app  # noqa: E402
from controlplane.gateway.openai import tokenization  # noqa: E402
from controlplane.gateway.openai.tokenization import DEFAULT_CHAT_TEMPLATE, ModelTokenizer  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def in_a_new_thread(work: Callable[[], object]) -> Callable[[], None]:
    """``work`` run in a thread started for it, as ASGI runs each request's sync code."""
    def run() -> None:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    return run


def row(name: str, baseline_s: float, now_s: float) -> None:
    print(f"| {name} | {baseline_s * 1e3:.3f} ms | {now_s * 1e3:.3f} ms | {baseline_s / now_s:.1f}x |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=Path("var/models/SmolLM2-135M-Instruct"))
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    templates = {"ChatML": DEFAULT_CHAT_TEMPLATE}
    if (args.model / "tokenizer.json").exists():
        templates[args.model.name] = ModelTokenizer.load(args.model).chat_template
    print("| work | baseline | now | baseline / now |")
    print("| --- | ---: | ---: | ---: |")
    for name, template in templates.items():
        def render(compiled: Callable[[str], object]) -> Callable[[], object]:
            return lambda: compiled(template).render(messages=MESSAGES, add_generation_prompt=True,
                                                     bos_token="", eos_token="")
        row(f"chat template, {name}", *interleaved_seconds(
            [render(tokenization._compiled.__wrapped__), render(tokenization._compiled)], args.repeat))
    row("Celery result backend, a request's thread", *interleaved_seconds(
        [in_a_new_thread(app._get_backend), in_a_new_thread(lambda: app.backend)], args.repeat // 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
