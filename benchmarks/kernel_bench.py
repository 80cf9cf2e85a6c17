"""Kernel choices of the stage engine, each against the one it replaced, side by side in one run.

    python benchmarks/kernel_bench.py [--threads 2] [--rows 1 2 4 8 16 32]

All on the demo model's 64 weight matrices (16 layers of q/k/v 1280 x 768, o 768 x 768, gate/up
4096 x 768, down 768 x 2048: 403 MB in fp32, far beyond the caches, as a model's layers are); each
figure is the median of a few passes over all of them, so a pass slowed by another process on the
machine does not decide it.

1. Dense fp32 matmul of a decode-sized batch: torch's default ``F.linear`` (MKL), oneDNN's inner
   product (``torch.ops.mkldnn._linear_pointwise``), our kernel ``worker_runtime.kernels.dense_matmul``
   and ``worker_runtime.dense.dense_linear`` (which picks one of them by rows), reported as weight
   GB/s; a plain ``sum`` over the same weights is the read ceiling.
2. The KV gather of one layer's attention: ``index_select`` on flat slots (what the engine does)
   against advanced indexing with a [batch, length] slot tensor (what it did), in microseconds.
3. Weight-only int8 matmul of the same row counts on the same matrices quantized (101 MB in int8):
   ``worker_runtime.kernels.int8_matmul`` (what ``Int8Linear`` runs on CPU) against
   ``torch._weight_int8pack_mm`` with the bf16 casts around it (what it ran before), and the fp32
   matrices through ``dense_linear``. Weight GB/s is the bytes of each format read per second; the
   last column is how many times faster one pass over the model's matrices is in int8 on our kernel
   than in fp32.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from worker_runtime.dense import dense_linear  # noqa: E402
from worker_runtime.kernels import dense_matmul, int8_matmul  # noqa: E402

DEMO_LAYER_SHAPES = [(1280, 768), (768, 768), (4096, 768), (768, 2048)]  # q/k/v, o, gate/up, down


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        weights = [torch.randn(shape, generator=generator) for shape in DEMO_LAYER_SHAPES * 16]
        print(f"{args.threads} threads\n")
        print("\n".join(dense_rows(args.rows, weights, generator)))
        print()
        print("\n".join(gather_rows([(1, 64), (4, 64), (32, 64)])))
        print()
        print("\n".join(int8_rows(args.rows, weights, generator)))


if __name__ == "__main__":
    main()
