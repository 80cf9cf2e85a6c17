"""The CPU int8 kernel (worker_runtime/kernels/int8_matmul.c): exact to fp32 rounding, its build, fallbacks.

Tolerance: the kernel sums k fp32 products in fp32, so against a float64 reference
``x @ (q * scales).T + bias`` each output may be off by a few units of fp32 rounding of the sum of
magnitudes: |error| <= 1e-6 * (|x| @ |q * scales|.T + |bias|) (measured at most 1.2e-7 over these shapes).
torch's bf16 kernel rounds the activations to 8 significant bits: 5.6e-4 to 7.0e-4 on the same measure.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worker_runtime.kernels import build, int8_matmul
from worker_runtime.quantize import Int8Linear

CPU = torch.device("cpu")
RELATIVE_BOUND = 1e-6
# (in_features, out_features): k not a multiple of the 8-wide vectors, odd n, n not split evenly by threads.
SHAPES = [(77, 131), (768, 97), (2051, 45), (1000, 301), (5, 3)]
# Every decode batch up to 32 rows (each tail of the 4-row tiles), then prefill sizes around 64-row panels.
ROWS = [*range(0, 33), 63, 64, 65, 130, 257]

pytestmark = pytest.mark.skipif(not int8_matmul.kernel_enabled(), reason="int8 CPU kernel not buildable here")


def layer_of(k: int, n: int, bias: bool, seed: int) -> tuple[Int8Linear, torch.Tensor]:
    """A loaded layer and its dequantized weight in float64."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=generator)
    layer = Int8Linear(k, n, bias, CPU, torch.float32)
    layer.load_rows(0, w)
    if bias:
        layer.bias.data = torch.randn(n, generator=generator)
    return layer, layer.weight.double() * layer.scales.double()[:, None]


def assert_exact_to_rounding(y: torch.Tensor, x: torch.Tensor, deq: torch.Tensor, bias) -> None:
    b = torch.zeros(deq.shape[0], dtype=torch.float64) if bias is None else bias.double()
    reference = x.double() @ deq.T + b
    magnitude = x.double().abs() @ deq.abs().T + b.abs()
    assert y.dtype == torch.float32 and y.shape == reference.shape
    worst = ((y.double() - reference).abs() / magnitude).max().item() if y.numel() else 0.0
    assert worst <= RELATIVE_BOUND, worst


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("bias", [False, True], ids=["no bias", "bias"])
@pytest.mark.parametrize("k,n", SHAPES)
def test_kernel_equals_the_float64_reference_for_every_batch_size(threads, k, n, bias):
    layer, deq = layer_of(k, n, bias, seed=k * n)
    assert layer.cpu_kernel
    generator = torch.Generator().manual_seed(threads)
    for rows in ROWS:
        x = torch.randn(rows, k, generator=generator)
        assert_exact_to_rounding(layer(x), x, deq, layer.bias)
    x3 = torch.randn(2, 3, k, generator=generator)  # leading dims are flattened and restored
    assert layer(x3).shape == (2, 3, n)
    assert_exact_to_rounding(layer(x3).view(6, n), x3.view(6, k), deq, layer.bias)


def test_forced_torch_switch_takes_torch_kernel(monkeypatch):
    monkeypatch.setenv("MOTLEY_INT8_KERNEL", "torch")
    layer, _ = layer_of(768, 97, True, seed=1)
    assert not layer.cpu_kernel
    x = torch.randn(1, 768)
    expected = torch._weight_int8pack_mm(x.bfloat16(), layer.weight, layer.scales).float() + layer.bias
    torch.testing.assert_close(layer(x), expected)


@pytest.fixture
def fresh_kernel(monkeypatch, tmp_path):
    """An empty kernel cache and no loaded kernel, restored afterwards."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOTLEY_KERNEL_CACHE", str(cache))
    int8_matmul._kernel.cache_clear()
    yield cache
    int8_matmul._kernel.cache_clear()


def unavailable_with_one_warning(caplog, reason: str) -> None:
    with caplog.at_level(logging.WARNING, logger="worker_runtime.kernels.int8_matmul"):
        layers = [Int8Linear(64, 32, False, CPU, torch.float32) for _ in range(3)]
    assert not any(layer.cpu_kernel for layer in layers)
    assert len(caplog.records) == 1 and reason in caplog.records[0].getMessage()
    layer = layers[0]
    layer.load_rows(0, torch.randn(32, 64))
    x = torch.randn(1, 64)
    expected = torch._weight_int8pack_mm(x.bfloat16(), layer.weight, layer.scales).float()
    torch.testing.assert_close(layer(x), expected)


def test_no_compiler_falls_back_with_one_warning(fresh_kernel, monkeypatch, caplog):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    unavailable_with_one_warning(caplog, "no gcc")


def test_a_compile_error_falls_back_with_one_warning(fresh_kernel, monkeypatch, caplog, tmp_path):
    broken = tmp_path / "int8_matmul.c"
    broken.write_text("this is not C\n")
    monkeypatch.setattr(int8_matmul, "SOURCE", broken)
    unavailable_with_one_warning(caplog, "failed")
    assert not list(fresh_kernel.glob("*.so")) and not list(fresh_kernel.glob(".build-*"))


def test_a_cpu_without_avx2_falls_back_with_one_warning(fresh_kernel, monkeypatch, caplog):
    library = build.shared_library(int8_matmul.SOURCE)
    monkeypatch.setattr(library, "motley_int8_cpu_supported", lambda: 0)
    monkeypatch.setattr(int8_matmul, "shared_library", lambda source: library)
    unavailable_with_one_warning(caplog, "lacks AVX2/FMA")


def test_the_library_is_cached_by_content_and_built_atomically(fresh_kernel):
    build.shared_library(int8_matmul.SOURCE)
    (built,) = fresh_kernel.glob("int8_matmul-*.so")
    stamp = built.stat().st_mtime_ns
    build.shared_library(int8_matmul.SOURCE)
    assert built.stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    assert [p.name for p in fresh_kernel.iterdir()] == [built.name]  # no temporary left behind


# A fresh process: other tests' imports must not decide what is mapped.
OPENMP_RUNTIMES_AFTER_A_MATMUL = """
import torch
from pathlib import Path
from worker_runtime.kernels.int8_matmul import int8_matmul
torch.set_num_threads(2)
int8_matmul(torch.randn(4, 1000), torch.ones(301, 1000, dtype=torch.int8), torch.ones(301).bfloat16(), None)
mapped = {Path(line.split()[-1]).resolve() for line in Path("/proc/self/maps").read_text().splitlines()}
print(*sorted({str(p) for p in mapped if p.name.startswith(("libgomp", "libomp", "libiomp"))}))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_only_torch_openmp_runtime_is_loaded():
    repo = Path(__file__).resolve().parents[2]
    script = [sys.executable, "-c", OPENMP_RUNTIMES_AFTER_A_MATMUL]
    done = subprocess.run(script, cwd=repo, capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == [str(build.torch_libgomp().resolve())]
    library = build.shared_library(int8_matmul.SOURCE)._name
    ldd = subprocess.run(["ldd", library], capture_output=True, text=True, check=True).stdout
    assert f"libgomp.so.1 => {build.torch_libgomp()}" in ldd
