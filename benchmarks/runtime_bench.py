"""Stage engine speed on the demo model, side by side with transformers, in one run.

    .venv/bin/python benchmarks/runtime_bench.py [--model DIR] [--threads N] [--rounds 2] [--json OUT]

Measures, with the same thread count for everything:
- decode tokens/s at batch 1 and 16 and prefill tokens/s: transformers' ``generate`` / forward on the
  same checkpoint (fp32) against our engine in fp32, bf16, int8 and int4 (one stage, all layers);
- the machine's memory bandwidth (a large tensor copy, read + write bytes over time) and the weight
  bytes each decode step reads over its time, as a fraction of that bandwidth: decode at batch 1 is
  memory-bound, so that fraction is what the engine is judged against.
Engines are measured in interleaved rounds and each figure is the median over rounds, because the
machine may be shared. Decode time excludes prefill: time(prefill + N tokens) - time(prefill + 1 token).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contracts.model_config import ModelConfig  # noqa: E402
from worker_runtime import Batch, SamplingParams, Stage, generate  # noqa: E402
from worker_runtime.make_demo_model import parse_args as demo_args  # noqa: E402
from worker_runtime.make_demo_model import write_demo_model  # noqa: E402

BATCH = 16


def memory_bandwidth(n_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Best-of copy bandwidth in bytes/s, counting the bytes read plus the bytes written."""
    src = torch.ones(n_bytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * n_bytes / best


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class Engine:
    """One way of running the model; subclasses time a decode of ``n`` tokens and a prefill."""

    name: str
    weight_bytes: int

    def decode_seconds(self, prompts: list[list[int]], n: int) -> float:
        return _timed(lambda: self.generate(prompts, n)) - _timed(lambda: self.generate(prompts, 1))

    def generate(self, prompts: list[list[int]], n: int) -> None:
        raise NotImplementedError

    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        raise NotImplementedError


class Ours(Engine):
    def __init__(self, model_dir: Path, bits: int, dtype: torch.dtype):
        layers = ModelConfig.from_file(model_dir).num_layers
        self.stage = Stage.load(model_dir, 0, layers, bits=bits, dtype=dtype, kv_tokens=8192)
        self.name = f"motley {'int' + str(bits) if bits < 16 else str(dtype).removeprefix('torch.')}"
        memory = self.stage.memory()
        embedding = self.stage.embed.weight.nbytes  # a lookup: decode reads one row of it, not all
        self.weight_bytes = memory.weight_bytes - embedding

    def generate(self, prompts: list[list[int]], n: int) -> None:
        generate([self.stage], prompts, SamplingParams(), max_new_tokens=n)

    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        ids = list(range(len(prompts)))
        seconds = _timed(lambda: self.stage.forward(Batch.of_tokens(ids, prompts, [0] * len(prompts))))
        for seq_id in ids:
            self.stage.kv.free(seq_id)
        return seconds


class Transformers(Engine):
    def __init__(self, model_dir: Path):
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.name = "transformers fp32"
        embedding = self.model.model.embed_tokens.weight.nbytes
        self.weight_bytes = sum(p.nbytes for p in self.model.parameters()) - embedding

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], n: int) -> None:
        ids = torch.tensor(prompts)
        self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=0,
        )

    @torch.inference_mode()
    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        ids = torch.tensor(prompts)
        return _timed(lambda: self.model(ids, attention_mask=torch.ones_like(ids), use_cache=True))


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    model_dir = Path(args.model) if args.model else Path(tempfile.mkdtemp()) / "demo"
    if not (model_dir / "config.json").exists():
        write_demo_model(demo_args([str(model_dir)]))
    vocab = ModelConfig.from_file(model_dir).vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(4, vocab, (n,), generator=generator).tolist()  # noqa: E731
    decode_prompts = {1: [prompt(args.prompt_len)], BATCH: [prompt(args.prompt_len) for _ in range(BATCH)]}
    prefill_prompts = [prompt(args.prefill_len) for _ in range(args.prefill_batch)]

    engines: list[Engine] = [Transformers(model_dir), Ours(model_dir, 16, torch.float32)]
    engines += [Ours(model_dir, 16, torch.bfloat16)]
    engines += [Ours(model_dir, bits, torch.float32) for bits in (8, 4)]
    for engine in engines:  # warm-up: first calls allocate and pick kernels
        engine.generate(decode_prompts[1], 2)
        engine.prefill_seconds(prefill_prompts)

    samples = {e.name: {"b1": [], "b16": [], "prefill": []} for e in engines}
    bandwidths = []
    for _ in range(args.rounds):
        bandwidths.append(memory_bandwidth())
        for engine in engines:
            s = samples[engine.name]
            for batch, key in ((1, "b1"), (BATCH, "b16")):
                seconds = engine.decode_seconds(decode_prompts[batch], args.tokens + 1)
                s[key].append(batch * args.tokens / seconds)
            prefill_tokens = args.prefill_batch * args.prefill_len
            s["prefill"].append(prefill_tokens / engine.prefill_seconds(prefill_prompts))

    bandwidth = statistics.median(bandwidths)
    results = {"threads": args.threads, "bandwidth_gb_s": bandwidth / 1e9, "engines": {}}
    for engine in engines:
        figures = {k: statistics.median(v) for k, v in samples[engine.name].items()}
        step_bytes_per_s = engine.weight_bytes * figures["b1"]
        results["engines"][engine.name] = {
            **figures,
            "weight_mb": engine.weight_bytes / 1e6,
            "weight_read_gb_s": step_bytes_per_s / 1e9,
            "bandwidth_fraction": step_bytes_per_s / bandwidth,
        }
    return results


def table(results: dict) -> str:
    engines = results["engines"]
    hf, fp32 = engines["transformers fp32"], engines["motley float32"]
    lines = [
        f"threads {results['threads']}, measured memory bandwidth (copy, read+write) "
        f"{results['bandwidth_gb_s']:.1f} GB/s",
        "",
        "| engine | weights MB | decode b1 tok/s | vs HF | vs our fp32 | decode b16 tok/s | vs HF "
        "| prefill tok/s | vs HF | weight GB/s at b1 | of bandwidth |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, e in engines.items():
        lines.append(
            f"| {name} | {e['weight_mb']:.0f} | {e['b1']:.1f} | {e['b1'] / hf['b1']:.2f}x | "
            f"{e['b1'] / fp32['b1']:.2f}x | {e['b16']:.1f} | {e['b16'] / hf['b16']:.2f}x | "
            f"{e['prefill']:.0f} | {e['prefill'] / hf['prefill']:.2f}x | "
            f"{e['weight_read_gb_s']:.1f} | {e['bandwidth_fraction']:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint dir (default: write the ~100M demo model to a temp dir)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16, help="decode tokens timed per measurement")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--prefill-len", type=int, default=128)
    parser.add_argument("--prefill-batch", type=int, default=2)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    results = run(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
