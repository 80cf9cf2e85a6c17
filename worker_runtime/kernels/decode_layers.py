"""The decode step of ``decode_layers.c``: every decoder layer of a stage for one new token per sequence, in
one call, on this package's matmul kernels; and the descriptors of the layers it runs.

On torch ops a batch-1 step of a small model is half dispatch: dozens of ops a layer of a few hundred
floats each (docs/benchmarks.md, "Where a batch-1 decode step goes"). The C code runs those ops as
loops and calls the int8 / int4 / fp32 kernels directly, so a step is one call from Python. The
descriptors hold raw pointers: they are built once, after a stage's weights are loaded, and stay valid
while the tensors they point at live (:class:`LayerSpecs` keeps them).

``MOTLEY_DECODE_KERNEL=torch`` keeps decode on torch ops (for operators who suspect this path). Where the
library cannot be built, one warning says why and decode runs on torch ops.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .loader import MIN_PARALLEL_WEIGHT_BYTES, Kernel

DENSE, INT8, INT4 = range(3)  # INT8: a scale per output channel (decoder layers' int8 format)
MAX_HEAD_DIM = 512  # the C code rotates a head in a stack buffer of this many floats


class LinearSpec(ctypes.Structure):
    """One linear layer as ``decode_layers.c``'s ``linear_t``: which kernel, and its tensors."""

    _fields_ = [
        ("kind", ctypes.c_int32),
        ("wide", ctypes.c_int32),
        ("fn", ctypes.c_void_p),
        ("weight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("k", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("group", ctypes.c_int64),
        ("shared", ctypes.c_int64),
    ]


class LayerSpec(ctypes.Structure):
    """One decoder layer as ``layer_t``: its norms' weights, its four linears and its KV cache."""

    _fields_ = [
        ("attention_norm", ctypes.c_void_p),
        ("ffn_norm", ctypes.c_void_p),
        ("qkv", LinearSpec),
        ("o", LinearSpec),
        ("gate_up", LinearSpec),
        ("down", LinearSpec),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
    ]


class ShapeSpec(ctypes.Structure):
    """The model's sizes and sliding window (0: none) as ``shape_t``, and the thread team's size for this
    call."""

    _fields_ = [
        ("hidden", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("kv_heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("eps", ctypes.c_float),
        ("threads", ctypes.c_int32),
        ("window", ctypes.c_int64),
    ]


KERNEL = Kernel(
    source=Path(__file__).with_name("decode_layers.c"),
    symbol="motley_decode_layers",
    argtypes=[ctypes.POINTER(LayerSpec), ctypes.c_int64, ctypes.POINTER(ShapeSpec), ctypes.c_void_p,
              ctypes.c_int64] + [ctypes.c_void_p] * 5 + [ctypes.c_int64],
    name="fused decode step",
    fallback="torch ops",
    switch="MOTLEY_DECODE_KERNEL",
    restype=ctypes.c_int,
)


def kernel_enabled() -> bool:
    """Whether stages built now should decode on this path (builds the library on the first call)."""
    return KERNEL.enabled()


def address(function: ctypes._CFuncPtr) -> int:
    """The machine address of a loaded kernel function, for a descriptor."""
    return ctypes.cast(function, ctypes.c_void_p).value


def pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def linear_spec(
    kind: int,
    function: ctypes._CFuncPtr,
    weight: torch.Tensor,
    scales: torch.Tensor | None,
    bias: torch.Tensor | None,
    k: int,
    n: int,
    group: int = 0,
    wide: bool = False,
) -> LinearSpec:
    """A descriptor of ``y = x @ W.T + bias`` on ``function`` (one of the package's kernels, of kind
    ``kind``); ``k`` inputs, ``n`` outputs. Every tensor must be contiguous, on CPU, and outlive it."""
    for tensor in (weight, scales, bias):
        if tensor is not None and not (tensor.is_contiguous() and tensor.is_cpu):
            raise ValueError("a fused decode layer's tensors must be contiguous CPU tensors")
    if bias is not None and bias.dtype != torch.float32:
        raise ValueError(f"a fused decode layer's bias must be fp32, not {bias.dtype}")
    shared = weight.nbytes >= MIN_PARALLEL_WEIGHT_BYTES
    return LinearSpec(kind, int(wide), address(function), pointer(weight), pointer(scales), pointer(bias),
                      k, n, group, int(shared))


@dataclass
class LayerSpecs:
    """A stage's layer descriptors and the model's shape; ``tensors`` keeps what they point at alive."""

    layers: ctypes.Array
    shape: ShapeSpec
    tensors: list[torch.Tensor] = field(default_factory=list)

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        write_slots: torch.Tensor,
        gather_slots: torch.Tensor,
        lengths: torch.Tensor,
    ) -> torch.Tensor:
        """Every layer over fp32 ``x`` [m, hidden], one new token per sequence: ``cos``/``sin`` [m, head_dim]
        fp32; int64 ``write_slots`` [m], ``lengths`` [m] (each sequence's length with the new token) and
        ``gather_slots`` [m * width] (row i: sequence i's key slots in order, padded past ``lengths[i]``).
        Writes each layer's new K/V into its cache; returns the new hidden states."""
        m = x.shape[0]
        width = gather_slots.numel() // m
        out = x.contiguous().clone()
        tensors = [t.contiguous() for t in (cos, sin, write_slots, gather_slots, lengths)]
        self.shape.threads = torch.get_num_threads()
        status = KERNEL.function(self.layers, len(self.layers), ctypes.byref(self.shape), out.data_ptr(), m,
                                 *(t.data_ptr() for t in tensors), width)
        if status:
            raise MemoryError(f"fused decode step: no scratch memory for {m} rows of {width} positions")
        return out
