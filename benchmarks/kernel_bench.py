"""Kernel choices of the stage engine, each against the one it replaced, side by side in one run.

    python benchmarks/kernel_bench.py [--threads 2] [--rows 1 4 16 32]

1. Dense fp32 matmul of a decode-sized batch: ``worker_runtime.dense.dense_linear`` against torch's
   default ``F.linear``, on 16 weights of 4096 x 768 (200 MB, far beyond the caches, as a model's
   layers are), reported as weight GB/s; a plain ``sum`` over the same weights is the read ceiling.
2. The KV gather of one layer's attention: ``index_select`` on flat slots (what the engine does)
   against advanced indexing with a [batch, length] slot tensor (what it did), in microseconds.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from worker_runtime.dense import dense_linear  # noqa: E402


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
    for _ in range(max(1, calls // 10)):
        fn()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def dense_rows(rows: list[int]) -> list[str]:
    weights = [torch.randn(4096, 768) for _ in range(16)]
    total = sum(w.nbytes for w in weights)
    ceiling = total / seconds_per_call(lambda: [w.sum() for w in weights], 5) / 1e9
    lines = [f"read ceiling (sum over the weights): {ceiling:.1f} GB/s", "",
             "| rows | F.linear GB/s | dense_linear GB/s | dense / F.linear |", "|---:|---:|---:|---:|"]
    for m in rows:
        x = torch.randn(m, 768)
        base = total / seconds_per_call(lambda: [F.linear(x, w) for w in weights], 5) / 1e9
        ours = total / seconds_per_call(lambda: [dense_linear(x, w, None) for w in weights], 5) / 1e9
        lines.append(f"| {m} | {base:.1f} | {ours:.1f} | {ours / base:.2f}x |")
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        print(f"{args.threads} threads\n")
        print("\n".join(dense_rows(args.rows)))
        print()
        print("\n".join(gather_rows([(1, 64), (4, 64), (32, 64)])))


if __name__ == "__main__":
    main()
