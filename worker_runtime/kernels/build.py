"""Compile a C kernel of this package into a shared library on first use, and cache it on disk.

Why plain C through gcc and ctypes rather than a torch C++ extension: the kernel needs no torch
headers, so it compiles in about a second on the 2-core build machine, where a minimal
``load_inline`` extension (``<ATen/Parallel.h>`` + ``<torch/library.h>``) takes ~36 s and needs
ninja; ctypes costs ~2 us more per call than a registered torch op, about 1 % of a decode step.

The library's OpenMP calls must land in torch's own OpenMP runtime, or two thread pools would spin
against each other on the same cores: it is linked against the libgomp torch bundles (torch/lib),
with that directory as its rpath. Both carry the soname ``libgomp.so.1``, so inside a process that
has imported torch the loader reuses torch's copy (tests check that only one libgomp is mapped).

The cache directory is ``$MOTLEY_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/motley/kernels``, else
``~/.cache/motley/kernels``. A library is named by a hash of its source, the headers beside it (which
it may include), the compiler commands (which name torch's libgomp) and torch's version, so an edit
or a torch upgrade builds a new one.
It is written under a temporary name and renamed into place, so processes building at the same
time never load a half-written file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..config import kernel_cache_dir

CFLAGS = ("-O3", "-std=gnu11", "-fPIC", "-fopenmp")
COMPILE_TIMEOUT_S = 120


class KernelUnavailable(RuntimeError):
    """The kernel cannot be built or loaded here; the message says why."""


def cache_dir() -> Path:
    return kernel_cache_dir()


def torch_libgomp() -> Path:
    """The GNU OpenMP runtime torch's CPU build loads (Linux wheels bundle it in torch/lib)."""
    path = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if not path.exists():
        raise KernelUnavailable(f"torch bundles no libgomp at {path} (its OpenMP runtime is not GNU's)")
    return path


def shared_library(source: Path) -> ctypes.CDLL:
    """Load ``source`` compiled as a shared library, building it into the cache first if needed."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise KernelUnavailable("no gcc on PATH")
    libgomp = torch_libgomp()
    code = [path.read_bytes() for path in (source, *sorted(source.parent.glob("*.h")))]
    link = ("-shared", str(libgomp), f"-Wl,-rpath,{libgomp.parent}")
    key = b"\0".join([*code, *(f.encode() for f in CFLAGS + link), torch.__version__.encode()])
    target = cache_dir() / f"{source.stem}-{hashlib.sha256(key).hexdigest()[:16]}.so"
    if not target.exists():
        _compile(gcc, source, link, target)
    try:
        return ctypes.CDLL(str(target))
    except OSError as e:
        raise KernelUnavailable(f"cannot load {target}: {e}") from e


def _compile(gcc: str, source: Path, link: tuple[str, ...], target: Path) -> None:
    """Compile, then link against torch's libgomp only (gcc's -fopenmp would add its own at link time)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
            obj, lib = Path(tmp) / "kernel.o", Path(tmp) / "kernel.so"
            compile_cmd = [gcc, *CFLAGS, "-c", str(source), "-o", str(obj)]
            for cmd in (compile_cmd, [gcc, str(obj), *link, "-o", str(lib)]):
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
                if done.returncode:
                    raise KernelUnavailable(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
            os.replace(lib, target)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KernelUnavailable(f"cannot build {target}: {e}") from e
