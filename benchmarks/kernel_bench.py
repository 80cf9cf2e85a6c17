"""Kernel choices of the stage engine, each against the alternative torch offers, side by side in one run.

    python benchmarks/kernel_bench.py [--threads 2] [--rows 1 2 4 8 16 32] [--int4-rows 1 4 16 128]
                                      [--sections dense gather int8 int4]

All on the demo model's 64 weight matrices (16 layers of q/k/v 1280 x 768, o 768 x 768, gate/up
4096 x 768, down 768 x 2048: 403 MB in fp32, far beyond the caches, as a model's layers are); each
figure is the median of a few passes over all of them, so a pass slowed by another process on the
machine does not decide it.

1. Dense fp32 matmul of a decode-sized batch: torch's default ``F.linear`` (MKL), oneDNN's inner
   product (``torch.ops.mkldnn._linear_pointwise``), our kernel ``worker_runtime.kernels.dense_matmul``
   and ``worker_runtime.dense.dense_linear`` (which picks one of them by rows), reported as weight
   GB/s; a plain ``sum`` over the same weights is the read ceiling.
2. The KV gather of one layer's attention: ``index_select`` on flat slots (what the engine does)
   against advanced indexing with a [batch, length] slot tensor, in microseconds.
3. Weight-only int8 matmul of the same row counts on the same matrices quantized (101 MB in int8):
   ``worker_runtime.kernels.int8_matmul`` (what ``Int8Linear`` runs on CPU) against
   ``torch._weight_int8pack_mm`` with the bf16 casts around it (torch's own path), and the fp32
   matrices through ``dense_linear``. Weight GB/s is the bytes of each format read per second; the
   last column is how many times faster one pass over the model's matrices is in int8 on our kernel
   than in fp32.
4. Weight-only int4 on SmolLM2-135M's 120 layer matrices (30 layers of qkv 960 x 576, o 576 x 576,
   gate_up 3072 x 576, down 576 x 1536; groups of 32: 66 MB, beyond the caches) for decode and prefill
   row counts (``--int4-rows``): ``Int4Linear`` on our kernel (``worker_runtime.kernels.int4_matmul``,
   its AVX-512 code where the CPU has it), the same kernel kept to its AVX2 code, and ``Int4Linear`` on
   torch's ``_weight_int4pack_mm_for_cpu`` (``MOTLEY_INT4_KERNEL=torch``: bf16 casts around it), as
   weight GB/s (packed weights plus scales and zeros) and the ratio to torch's within the run.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from contracts.profiler import DEFAULT_GROUP_SIZE  # noqa: E402
from worker_runtime.dense import dense_linear  # noqa: E402
from worker_runtime.kernels import dense_matmul, int4_matmul, int8_matmul  # noqa: E402
from worker_runtime.quantize import Int4Linear  # noqa: E402

DEMO_LAYER_SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]  # q/k/v, o, gate/up, down
SMOLLM2_LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # the same, SmolLM2-135M's
SMOLLM2_LAYERS = 30
SECTIONS = ["dense", "gather", "int8", "int4"]


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    """The median time of ``calls`` calls, after a tenth as many to warm up."""
    for _ in range(max(1, calls // 10)):
        fn()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved_seconds(passes: list[Callable[[], object]], rounds: int) -> list[float]:
    """Each pass's median time over ``rounds`` rounds that run every pass once in turn (after one round to
    warm up), so that load from other processes falls on all of them alike."""
    times: list[list[float]] = [[] for _ in passes]
    for round_ in range(rounds + 1):
        for fn, spent in zip(passes, times):
            started = time.perf_counter()
            fn()
            if round_:
                spent.append(time.perf_counter() - started)
    return [statistics.median(spent) for spent in times]


def dense_rows(rows: list[int], weights: list[torch.Tensor], generator: torch.Generator) -> list[str]:
    total = sum(w.nbytes for w in weights)
    ceiling = total / seconds_per_call(lambda: [w.sum() for w in weights], 5) / 1e9
    lines = [f"read ceiling (sum over the weights): {ceiling:.1f} GB/s", "",
             "| rows | F.linear GB/s | oneDNN GB/s | fp32 kernel GB/s | dense_linear GB/s | ours / oneDNN |",
             "|---:|---:|---:|---:|---:|---:|"]
    for m in rows:
        xs = {k: torch.randn(m, k, generator=generator) for _, k in DEMO_LAYER_SHAPES}

        def rate(matmul: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
            return total / seconds_per_call(lambda: [matmul(xs[w.shape[1]], w) for w in weights], 5) / 1e9

        mkl = rate(F.linear)
        onednn = rate(lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""))
        enabled = dense_matmul.kernel_enabled()
        ours = rate(lambda x, w: dense_matmul.dense_matmul(x, w, None)) if enabled else float("nan")
        chosen = rate(lambda x, w: dense_linear(x, w, None))
        lines.append(f"| {m} | {mkl:.1f} | {onednn:.1f} | {ours:.1f} | {chosen:.1f} | {ours / onednn:.2f}x |")
    return lines


def gather_rows(shapes: list[tuple[int, int]]) -> list[str]:
    cache = torch.randn(65536, 4, 64)  # slots x kv heads x head dim
    lines = ["| sequences x keys | advanced indexing us | index_select us | indexing / index_select |",
             "|---|---:|---:|---:|"]
    for batch, length in shapes:
        slots = torch.randint(0, cache.shape[0], (batch, length))
        flat = slots.view(-1)
        old = seconds_per_call(lambda: cache[slots], 2000) * 1e6
        new = seconds_per_call(lambda: cache.index_select(0, flat).view(batch, length, 4, 64), 2000) * 1e6
        lines.append(f"| {batch} x {length} | {old:.1f} | {new:.1f} | {old / new:.2f}x |")
    return lines


def int8_rows(rows: list[int], dense: list[torch.Tensor], generator: torch.Generator) -> list[str]:
    if not int8_matmul.kernel_enabled():
        return ["int8 kernel unavailable here (see the logged warning): nothing to compare"]
    shapes = [w.shape for w in dense]
    q = [torch.randint(-127, 128, shape, dtype=torch.int8, generator=generator) for shape in shapes]
    scales = [(torch.rand(n, generator=generator) / 100).bfloat16() for n, _ in shapes]
    int8_bytes, fp32_bytes = sum(w.nbytes for w in q), sum(w.nbytes for w in dense)
    lines = ["| rows | int8 kernel GB/s | _weight_int8pack_mm GB/s | fp32 dense_linear GB/s "
             "| kernel / int8pack | fp32 time / kernel time |", "|---:|---:|---:|---:|---:|---:|"]
    for m in rows:
        xs = {k: torch.randn(m, k, generator=generator) for _, k in DEMO_LAYER_SHAPES}
        pairs = list(zip(q, scales))
        ours = seconds_per_call(
            lambda: [int8_matmul.int8_matmul(xs[w.shape[1]], w, s, None) for w, s in pairs], 5
        )
        packed = seconds_per_call(
            lambda: [torch._weight_int8pack_mm(xs[w.shape[1]].bfloat16(), w, s).float() for w, s in pairs], 5
        )
        fp32 = seconds_per_call(lambda: [dense_linear(xs[w.shape[1]], w, None) for w in dense], 5)
        lines.append(f"| {m} | {int8_bytes / ours / 1e9:.1f} | {int8_bytes / packed / 1e9:.1f} | "
                     f"{fp32_bytes / fp32 / 1e9:.1f} | {packed / ours:.2f}x | {fp32 / ours:.2f}x |")
    return lines


def int4_layers(kernel: str, generator: torch.Generator) -> list[Int4Linear]:
    """SmolLM2's layer matrices as int4 layers on ``kernel`` ("auto": ours, "torch": torch's)."""
    with mock.patch.dict(os.environ, {"MOTLEY_INT4_KERNEL": kernel}):
        layers = [Int4Linear(k, n, False, torch.device("cpu"), torch.float32, DEFAULT_GROUP_SIZE)
                  for n, k in SMOLLM2_LAYER_SHAPES * SMOLLM2_LAYERS]
    for layer in layers:
        layer.load_rows(0, torch.randn(layer.out_features, layer.in_features, generator=generator))
        layer.finish()
    return layers


def int4_rows(rows: list[int], generator: torch.Generator) -> list[str]:
    if not int4_matmul.kernel_enabled():
        return ["int4 kernel unavailable here (see the logged warning): nothing to compare"]
    ours, theirs = int4_layers("auto", generator), int4_layers("torch", generator)
    assert all(layer.cpu_kernel for layer in ours) and not any(layer.cpu_kernel for layer in theirs)
    nbytes = sum(layer.weight.nbytes + layer.scales_and_zeros.nbytes for layer in ours)
    wide = "AVX-512" if int4_matmul.avx512_available() else "AVX2 (no AVX-512 here)"
    as_fp32 = torch.randn(nbytes // 4, generator=generator)  # torch sums integers far below bandwidth
    ceiling = nbytes / seconds_per_call(as_fp32.sum, 5) / 1e9
    lines = [f"int4 weights: {nbytes / 1e6:.1f} MB (groups of {DEFAULT_GROUP_SIZE}); our kernel runs {wide}; "
             f"read ceiling (sum over as many fp32 bytes): {ceiling:.1f} GB/s", "",
             "| rows | our kernel GB/s | ours, AVX2 code GB/s | _weight_int4pack_mm_for_cpu GB/s "
             "| ours / torch | AVX2 / torch |", "|---:|---:|---:|---:|---:|---:|"]
    for m in rows:
        xs = {k: torch.randn(m, k, generator=generator) for _, k in SMOLLM2_LAYER_SHAPES}

        def avx2_only(layer: Int4Linear) -> torch.Tensor:
            x, weight, scales = xs[layer.in_features], layer.weight, layer.scales_and_zeros
            return int4_matmul.int4_matmul(x, weight, scales, layer.group_size, None, avx512=False)

        passes = [lambda: [layer(xs[layer.in_features]) for layer in ours],
                  lambda: [avx2_only(layer) for layer in ours],
                  lambda: [layer(xs[layer.in_features]) for layer in theirs]]
        kernel, avx2, packed = interleaved_seconds(passes, max(3, 60 // m))  # prefill: a few seconds
        lines.append(f"| {m} | {nbytes / kernel / 1e9:.1f} | {nbytes / avx2 / 1e9:.1f} | "
                     f"{nbytes / packed / 1e9:.1f} | {packed / kernel:.2f}x | {packed / avx2:.2f}x |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--int4-rows", type=int, nargs="+", default=[1, 4, 16, 128])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=SECTIONS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    print(f"{args.threads} threads, load average %.2f %.2f %.2f\n" % os.getloadavg())

    @functools.cache
    def weights() -> list[torch.Tensor]:
        return [torch.randn(shape, generator=generator) for shape in DEMO_LAYER_SHAPES * 16]

    with torch.inference_mode():
        sections = {
            "dense": lambda: dense_rows(args.rows, weights(), generator),
            "gather": lambda: gather_rows([(1, 64), (4, 64), (32, 64)]),
            "int8": lambda: int8_rows(args.rows, weights(), generator),
            "int4": lambda: int4_rows(args.int4_rows, generator),
        }
        for name in args.sections:
            print("\n".join(sections[name]()))
            print()


if __name__ == "__main__":
    main()
