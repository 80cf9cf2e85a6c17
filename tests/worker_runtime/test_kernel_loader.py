"""The CPU kernels' build and loading (worker_runtime/kernels: build.py, loader.py): where a kernel cannot
be had, one warning names why and torch's kernel serves; the cache; torch's OpenMP runtime only."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from worker_runtime.dense import dense_linear, weight_dtype
from worker_runtime.kernels import build, dense_matmul, int4_matmul, int8_matmul, loader
from worker_runtime.quantize import Int4Linear, Int8Linear

CPU = torch.device("cpu")

DENSE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BUILDABLE = all((int8_matmul.kernel_enabled(), int4_matmul.kernel_enabled(),
                 *(dense_matmul.kernel_enabled(dtype) for dtype in DENSE_DTYPES)))
pytestmark = pytest.mark.skipif(not BUILDABLE, reason="CPU kernels not buildable here")


def int8_layers_fall_back() -> None:
    layers = [Int8Linear(64, 32, False, CPU, torch.float32) for _ in range(3)]
    assert not any(layer.cpu_kernel for layer in layers)
    layer = layers[0]
    layer.load_rows(0, torch.randn(32, 64))
    x = torch.randn(1, 64)
    expected = torch._weight_int8pack_mm(x.bfloat16(), layer.weight, layer.scales).float()
    torch.testing.assert_close(layer(x), expected)


def int4_layers_fall_back() -> None:
    layers = [Int4Linear(64, 32, False, CPU, torch.float32) for _ in range(3)]
    assert not any(layer.cpu_kernel for layer in layers)
    layer = layers[0]
    layer.load_rows(0, torch.randn(32, 64))
    layer.finish()
    x = torch.randn(1, 64)
    expected = torch._weight_int4pack_mm_for_cpu(x.bfloat16(), layer.weight, 32, layer.scales_and_zeros)
    torch.testing.assert_close(layer(x), expected.float())


def dense_calls_fall_back() -> None:
    x, weight = torch.randn(1, 512), torch.randn(1024, 512) / 512**0.5  # 2 MiB: one the kernel would take
    for _ in range(3):
        torch.testing.assert_close(dense_linear(x, weight, None), F.linear(x, weight))
    assert not dense_matmul.kernel_enabled()


def stages_widen(dtype: torch.dtype) -> Callable[[], None]:
    """Stages keep no ``dtype`` weights for fp32 compute (they widen them as they load), and a linear
    handed such a weight still computes the widened product."""

    def check() -> None:
        x, weight = torch.randn(1, 512), (torch.randn(1024, 512) / 512**0.5).to(dtype)
        for _ in range(3):
            assert weight_dtype(dtype, CPU, torch.float32) == torch.float32
            torch.testing.assert_close(dense_linear(x, weight, None), F.linear(x, weight.float()))

    return check


@dataclass
class KernelUnderTest:
    module: ModuleType
    name: str  # the module's attribute that holds the loader.Kernel
    falls_back: Callable[[], None]  # uses the kernel's layer or function a few times, checking the results
    cache: Path

    @property
    def kernel(self) -> loader.Kernel:
        return getattr(self.module, self.name)


FALLBACKS = {
    "int8": (int8_matmul, "KERNEL", int8_layers_fall_back),
    "int4": (int4_matmul, "KERNEL", int4_layers_fall_back),
    "fp32": (dense_matmul, "KERNEL", dense_calls_fall_back),
    "fp16": (dense_matmul, "F16_KERNEL", stages_widen(torch.float16)),
    "bf16": (dense_matmul, "BF16_KERNEL", stages_widen(torch.bfloat16)),
}


@pytest.fixture(params=sorted(FALLBACKS))
def kernel(request, monkeypatch, tmp_path):
    """One kernel with an empty kernel cache and nothing loaded (a fresh ``Kernel``), restored afterwards."""
    module, name, falls_back = FALLBACKS[request.param]
    cache = tmp_path / "cache"
    monkeypatch.setenv("MOTLEY_KERNEL_CACHE", str(cache))
    monkeypatch.setattr(module, name, dataclasses.replace(getattr(module, name)))
    return KernelUnderTest(module, name, falls_back, cache)


def falls_back_with_one_warning(kernel: KernelUnderTest, caplog, reason: str) -> None:
    with caplog.at_level(logging.WARNING):
        kernel.falls_back()
    assert len(caplog.records) == 1 and reason in caplog.records[0].getMessage()


def test_no_compiler_falls_back_with_one_warning(kernel, monkeypatch, caplog):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    falls_back_with_one_warning(kernel, caplog, "no gcc")


def test_a_compile_error_falls_back_with_one_warning(kernel, monkeypatch, caplog, tmp_path):
    broken = tmp_path / kernel.kernel.source.name
    broken.write_text("this is not C\n")
    monkeypatch.setattr(kernel.module, kernel.name, dataclasses.replace(kernel.kernel, source=broken))
    falls_back_with_one_warning(kernel, caplog, "failed")
    assert not list(kernel.cache.glob("*.so")) and not list(kernel.cache.glob(".build-*"))


def test_a_cpu_without_avx2_falls_back_with_one_warning(kernel, monkeypatch, caplog):
    library = build.shared_library(kernel.kernel.source)
    monkeypatch.setattr(library, "motley_cpu_supported", lambda: 0)
    monkeypatch.setattr(loader, "shared_library", lambda source: library)
    falls_back_with_one_warning(kernel, caplog, "lacks AVX2/FMA")


def test_an_unknown_switch_value_warns_once_and_means_auto(monkeypatch, caplog):
    monkeypatch.setenv("MOTLEY_DENSE_KERNEL", "tourch")
    with caplog.at_level(logging.WARNING):
        assert [loader.switched_to_torch("MOTLEY_DENSE_KERNEL") for _ in range(3)] == [False] * 3
    assert len(caplog.records) == 1 and "'tourch'" in caplog.records[0].getMessage()


def test_the_library_is_cached_by_content_and_built_atomically(kernel):
    build.shared_library(kernel.kernel.source)
    (built,) = kernel.cache.glob(f"{kernel.kernel.source.stem}-*.so")
    stamp = built.stat().st_mtime_ns
    build.shared_library(kernel.kernel.source)
    assert built.stat().st_mtime_ns == stamp  # loaded from the cache, not rebuilt
    assert [p.name for p in kernel.cache.iterdir()] == [built.name]  # no temporary left behind


def test_an_edited_header_builds_a_new_library(monkeypatch, tmp_path):
    cache, sources = tmp_path / "cache", tmp_path / "kernels"
    monkeypatch.setenv("MOTLEY_KERNEL_CACHE", str(cache))
    sources.mkdir()
    for path in (dense_matmul.KERNEL.source, *dense_matmul.KERNEL.source.parent.glob("*.h")):
        shutil.copy(path, sources)
    build.shared_library(sources / "dense_matmul.c")
    with (sources / "tiled_matmul.h").open("a") as header:
        header.write("/* edited */\n")
    build.shared_library(sources / "dense_matmul.c")
    assert len(list(cache.glob("dense_matmul-*.so"))) == 2


# A fresh process: other tests' imports must not decide what is mapped.
OPENMP_RUNTIMES_AFTER_MATMULS = """
import torch
from pathlib import Path
from worker_runtime.kernels.dense_matmul import dense_matmul
from worker_runtime.kernels.int4_matmul import int4_matmul
from worker_runtime.kernels.int8_matmul import int8_matmul
torch.set_num_threads(2)
int8_matmul(torch.randn(4, 1000), torch.ones(301, 1000, dtype=torch.int8), torch.ones(301).bfloat16(), None)
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    dense_matmul(torch.randn(4, 1000), torch.ones(301, 1000, dtype=dtype), None)
int4_weight, int4_scales = (torch.ones(20, 128, 16, dtype=torch.int32),
                            torch.ones(20, 32, 16, dtype=torch.int32))
int4_matmul(torch.randn(4, 1024), int4_weight, int4_scales, 32, None)
mapped = {Path(line.split()[-1]).resolve() for line in Path("/proc/self/maps").read_text().splitlines()}
print(*sorted({str(p) for p in mapped if p.name.startswith(("libgomp", "libomp", "libiomp"))}))
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
def test_only_torch_openmp_runtime_is_loaded():
    repo = Path(__file__).resolve().parents[2]
    script = [sys.executable, "-c", OPENMP_RUNTIMES_AFTER_MATMULS]
    done = subprocess.run(script, cwd=repo, capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.split() == [str(build.torch_libgomp().resolve())]
    kernels = (int8_matmul.KERNEL, int4_matmul.KERNEL, dense_matmul.KERNEL, dense_matmul.F16_KERNEL,
               dense_matmul.BF16_KERNEL)
    for kernel in kernels:
        library = build.shared_library(kernel.source)._name
        ldd = subprocess.run(["ldd", library], capture_output=True, text=True, check=True).stdout
        assert f"libgomp.so.1 => {build.torch_libgomp()}" in ldd
