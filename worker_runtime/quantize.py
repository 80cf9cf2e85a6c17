"""Weight-only int8 (per output channel) and int4 (group-wise) linear layers.

Decode is memory-bound, so the point is to read fewer weight bytes per token. The layers fill
themselves row block by row block while a stage loads (:meth:`load_rows`), so a full-precision copy
of a whole matrix never exists. On CPU they run this package's own kernels, which keep activations
fp32 and read the weights faster than torch's kernels at decode: ``kernels.int8_matmul`` for the
int8 layers of fp32 stages, ``kernels.int4_matmul`` for int4 layers at every stage dtype; they fall
back to torch's packed kernels where ours cannot be built or are switched off. torch's kernels run
on bfloat16 activations: on CPU that is the only fast path torch has (fp32 inputs hit a scalar
fallback several times slower than a dense fp32 matmul), and on CUDA, where they always serve, the
int4 kernel accepts nothing else. Inputs and outputs keep the stage's dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from contracts.profiler import DEFAULT_GROUP_SIZE

from .kernels import int4_matmul as int4_kernel
from .kernels.int8_matmul import GROUP as GROUPED_INT8
from .kernels.int8_matmul import int8_matmul, kernel_enabled

KERNEL_DTYPE = torch.bfloat16
INT4_GROUP_SIZES = (256, 128, 64, 32)  # what torch's int4 kernels accept
_CPU_PACK_ROWS = 64  # torch's CPU int4 packing is independent per block of 64 rows
_CUDA_INNER_K_TILES = 8


class QuantizationError(ValueError):
    """A layer whose shape the chosen packed kernel cannot take; the message says which constraint."""


@functools.cache
def int8_kernel_available(device_type: str) -> bool:
    """Whether ``torch._weight_int8pack_mm`` runs on this kind of device (probed once)."""
    try:
        device = torch.device(device_type)
        x = torch.zeros(1, 32, dtype=KERNEL_DTYPE, device=device)
        w = torch.zeros(32, 32, dtype=torch.int8, device=device)
        torch._weight_int8pack_mm(x, w, torch.ones(32, dtype=KERNEL_DTYPE, device=device))
        return True
    except (RuntimeError, NotImplementedError):
        return False


def quantize_int8_rows(w: torch.Tensor, group: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8: returns (int8 rows, bf16 scales [rows], or [rows, cols / group] with one scale per
    ``group`` weights of a row); each scale is rounded to bf16 before use.

    Works in place on one fp32 copy of the block, so loading needs little memory beyond the result.
    """
    rows, cols = w.shape
    w = w.to(torch.float32, copy=True).view(rows, -1, group or cols)
    scales = (torch.maximum(w.amax(dim=-1), -w.amin(dim=-1)).clamp(min=1e-8) / 127).to(KERNEL_DTYPE)
    q = w.div_(scales.float()[..., None]).round_().clamp_(-127, 127).to(torch.int8).view(rows, cols)
    return q, scales if group else scales[:, 0]


def quantize_int4_rows(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise int4: returns (uint8 values 0..15, bf16 scales_and_zeros [groups, rows, 2]).

    torch's kernels dequantize as ``(q - 8) * scale + zero``, so ``zero`` is the group minimum plus 8 scales.
    """
    rows, cols = w.shape
    groups = w.to(torch.float32, copy=True).view(rows, cols // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((hi - lo).clamp(min=1e-8) / 15).to(KERNEL_DTYPE)
    zero = (lo + 8 * scale.float()).to(KERNEL_DTYPE)
    minimum = zero.float() - 8 * scale.float()
    q = groups.sub_(minimum[..., None]).div_(scale.float()[..., None]).round_().clamp_(0, 15)
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return q.view(rows, cols).to(torch.uint8), scales_and_zeros


def pick_group_size(in_features: int, wanted: int) -> int:
    """The largest supported group size no larger than ``wanted`` that divides ``in_features``."""
    for size in INT4_GROUP_SIZES:
        if size <= wanted and in_features % size == 0:
            return size
    raise QuantizationError(
        f"int4: in_features {in_features} is not a multiple of any group size {INT4_GROUP_SIZES}"
    )


class Int8Linear(nn.Module):
    """Symmetric int8 weights with a bf16 scale per output channel, or with ``group``, per ``group``
    weights of a row (the output head's format: torch has no kernel for it, so it runs on our CPU kernel
    whatever the stage's dtype, and elsewhere dequantizes its weights on every call)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
        group: int | None = None,
    ):
        super().__init__()
        if group is not None and (group != GROUPED_INT8 or in_features % group):
            raise QuantizationError(f"grouped int8: groups of {group} for in_features {in_features}; "
                                    f"the kernel takes groups of {GROUPED_INT8} dividing the input")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        weight = torch.empty(out_features, in_features, dtype=torch.int8, device=device)
        self.register_buffer("weight", weight)
        scale_shape = (out_features,) if group is None else (out_features, in_features // group)
        self.register_buffer("scales", torch.empty(scale_shape, dtype=KERNEL_DTYPE, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self.use_kernel = int8_kernel_available(device.type) and group is None
        cpu_dtypes = (torch.float32,) if group is None else (torch.float32, torch.bfloat16, torch.float16)
        self.cpu_kernel = device.type == "cpu" and dtype in cpu_dtypes and kernel_enabled(group is not None)

    def load_rows(self, row0: int, w: torch.Tensor, columns: slice | None = None) -> None:
        """Quantize rows ``row0..``; with ``columns``, keep only those columns of whole rows, quantized
        with the whole rows' scales (a tensor-parallel shard's columns, as the whole matrix holds them)."""
        q, scales = quantize_int8_rows(w.to(self.weight.device), self.group)
        if columns is not None:
            if self.group is not None:
                raise QuantizationError("grouped int8 weights are not split by columns")
            q = q[:, columns]
        self.weight[row0 : row0 + q.shape[0]] = q
        self.scales[row0 : row0 + q.shape[0]] = scales

    def finish(self) -> None:
        """Nothing is staged for int8; present so every quantized layer loads the same way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.cpu_kernel and x.is_cpu and x.dtype == torch.float32:  # no dtype round trip: a decode step's
            y = int8_matmul(x2, self.weight, self.scales, self.bias)  # ~400 no-op casts cost ~0.4 ms
            return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)
        if self.cpu_kernel and x.is_cpu and self.group:
            bias = None if self.bias is None else self.bias.float()
            y = int8_matmul(x2.float(), self.weight, self.scales, bias).to(x.dtype)
            return y.view(*x.shape[:-1], self.out_features)
        x2 = x2.to(KERNEL_DTYPE)
        if self.use_kernel:
            y = torch._weight_int8pack_mm(x2, self.weight, self.scales)
        elif self.group:
            dequantized = self.weight.view(self.out_features, -1, self.group) * self.scales[..., None]
            y = F.linear(x2, dequantized.view(self.out_features, self.in_features).to(KERNEL_DTYPE))
        else:
            y = F.linear(x2, self.weight.to(KERNEL_DTYPE)) * self.scales
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """Asymmetric int4 weights, a bf16 scale and zero per ``group_size`` weights of a row. On CPU they run
    on our kernel (``kernels.int4_matmul``) in its tile layout, activations cast to fp32 for it where the
    stage's dtype is not; where that kernel is switched off or cannot be built, and on CUDA, on torch's
    packed kernels in theirs."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: torch.device,
        dtype: torch.dtype,
        group_size: int = DEFAULT_GROUP_SIZE,
    ):
        super().__init__()
        if out_features % 16:
            raise QuantizationError(f"int4: out_features {out_features} is not a multiple of 16")
        self.in_features, self.out_features = in_features, out_features
        self.group_size = pick_group_size(in_features, group_size)
        self.on_cpu = device.type == "cpu"
        self.cpu_kernel = self.on_cpu and int4_kernel.kernel_enabled()
        groups = in_features // self.group_size
        scales_shape = (groups, out_features, 2)
        if self.cpu_kernel:
            tiles = out_features // int4_kernel.TILE
            packed = torch.empty(tiles, in_features // 8, int4_kernel.TILE, dtype=torch.int32, device=device)
            scales_shape = (tiles, groups, int4_kernel.TILE)  # an int32 per (scale, zero) pair
        elif self.on_cpu:
            packed = torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device)
        else:
            if in_features % (16 * _CUDA_INNER_K_TILES):
                raise QuantizationError(f"int4 on cuda: in_features {in_features} is not a multiple of 128")
            packed = torch.empty(0, dtype=torch.int32, device=device)  # shape known after packing
        self.register_buffer("weight", packed)
        scales_dtype = torch.int32 if self.cpu_kernel else KERNEL_DTYPE
        self.register_buffer("scales_and_zeros", torch.empty(scales_shape, dtype=scales_dtype, device=device))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device)) if bias else None
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (values, scales_and_zeros) of rows
        self._packed_rows = 0

    def load_rows(self, row0: int, w: torch.Tensor) -> None:
        """Quantize rows ``row0..``; rows must arrive in order, since packing works on whole row blocks."""
        pending_rows = sum(q.shape[0] for q, _ in self._pending)
        if row0 != self._packed_rows + pending_rows:
            raise ValueError("int4 rows must be loaded in order")
        self._pending.append(quantize_int4_rows(w.to(self.scales_and_zeros.device), self.group_size))
        if self.on_cpu:
            self._pack_cpu(final=False)

    def _staged(self) -> tuple[torch.Tensor, torch.Tensor]:
        if len(self._pending) == 1:
            return self._pending[0]
        return torch.cat([q for q, _ in self._pending]), torch.cat([sz for _, sz in self._pending], dim=1)

    def _pack_cpu(self, final: bool) -> None:
        """Pack the staged rows that fill whole blocks (``final``: all of them): tiles of 16 rows for our
        kernel, blocks of 64 for torch's."""
        q, scales_and_zeros = self._staged()
        block = int4_kernel.TILE if self.cpu_kernel else _CPU_PACK_ROWS
        ready = q.shape[0] if final else q.shape[0] // block * block
        r = self._packed_rows
        if self.cpu_kernel and ready:
            weight, scales = int4_kernel.tile_layout(q[:ready], scales_and_zeros[:, :ready])
            self.weight[r // int4_kernel.TILE : (r + ready) // int4_kernel.TILE] = weight
            self.scales_and_zeros[r // int4_kernel.TILE : (r + ready) // int4_kernel.TILE] = scales
        elif ready:
            self.scales_and_zeros[:, r : r + ready] = scales_and_zeros[:, :ready]
            for start in range(0, ready, block):  # the packer wants int32: one block at a time
                rows = q[start : min(start + block, ready)].to(torch.int32)
                packed = torch._convert_weight_to_int4pack_for_cpu(rows, 1)
                self.weight[r + start : r + start + rows.shape[0]] = packed
        self._packed_rows += ready
        self._pending = [(q[ready:], scales_and_zeros[:, ready:])] if ready < q.shape[0] else []

    def finish(self) -> None:
        """Pack the rows still staged (on CUDA: the whole matrix, one byte a weight, packed on the device)."""
        if not self._pending:
            return
        if self.on_cpu:
            self._pack_cpu(final=True)
            return
        q, scales_and_zeros = self._staged()
        self.scales_and_zeros.copy_(scales_and_zeros)
        self._pending = []
        nibbles = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()
        self.weight = torch._convert_weight_to_int4pack(nibbles, _CUDA_INNER_K_TILES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.cpu_kernel:
            fp32 = x.dtype == torch.float32  # no dispatched no-op casts: ~1 us each, hundreds a step
            bias = self.bias if self.bias is None or fp32 else self.bias.float()
            x2 = x2 if fp32 else x2.float()
            y = int4_kernel.int4_matmul(x2, self.weight, self.scales_and_zeros, self.group_size, bias)
            y = y if fp32 else y.to(x.dtype)
            return y if x.dim() == 2 else y.view(*x.shape[:-1], self.out_features)
        x2 = x2 if x2.dtype == KERNEL_DTYPE else x2.to(KERNEL_DTYPE)
        if self.on_cpu:
            y = torch._weight_int4pack_mm_for_cpu(x2, self.weight, self.group_size, self.scales_and_zeros)
        else:
            y = torch._weight_int4pack_mm(x2, self.weight, self.group_size, self.scales_and_zeros)
        y = y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias


def quantized_linear(
    linear: nn.Linear,
    bits: int,
    device: torch.device,
    dtype: torch.dtype,
    group_size: int,
    int8_group: int | None = None,
) -> nn.Module:
    """An empty int8/int4 replacement for ``linear`` (which may live on the meta device); ``int8_group``:
    int8 scales per that many weights of a row instead of per row."""
    args = (linear.in_features, linear.out_features, linear.bias is not None, device, dtype)
    if bits == 8:
        return Int8Linear(*args, group=int8_group)
    if bits == 4:
        return Int4Linear(*args, group_size=group_size)
    raise ValueError(f"bits must be 16, 8 or 4, got {bits}")
