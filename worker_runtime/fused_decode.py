"""Which stages run their decode steps as one fused call (``kernels.decode_layers``), and the descriptors of
their layers for it.

A stage qualifies when the C path computes exactly what its torch ops would: an fp32 stage on CPU whose
every linear layer already runs on one of this package's CPU kernels (fp32 weights, or fp16/bf16 weights
kept 16-bit for an fp32 stage, int8 per row, int4). A step
qualifies when every sequence of the batch adds one token (decode), whatever their lengths and sliding
window. Everything else (prefill, a batch mixing prefill and decode, bf16/fp16 stages, CUDA) runs on torch
ops as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .dense import Linear
from .kernels import decode_layers, dense_matmul
from .kernels import int4_matmul as int4_kernel
from .kernels import int8_matmul as int8_kernel
from .kv_cache import AttentionPlan
from .quantize import Int4Linear, Int8Linear

if TYPE_CHECKING:
    from .stage import Stage


def fused_layers(stage: Stage) -> decode_layers.LayerSpecs | None:
    """The descriptors of ``stage``'s layers (its weights loaded), or None where it does not qualify."""
    config = stage.config
    if (
        stage.device.type != "cpu"
        or stage.dtype != torch.float32
        or config.head_dim > decode_layers.MAX_HEAD_DIM
        or config.head_dim % 2
        or not decode_layers.kernel_enabled()
    ):
        return None
    specs, tensors = [], []
    for layer in stage.layers:
        attention, ffn = layer.attention, layer.feed_forward
        linears = [_linear_spec(m, tensors) for m in (attention.wqkv, attention.wo, ffn.w13, ffn.w2)]
        norms = (layer.attention_norm.weight, layer.ffn_norm.weight)
        if any(spec is None for spec in linears) or any(w.dtype != torch.float32 for w in norms):
            return None
        tensors.extend(norms)
        k_cache, v_cache = stage.kv.k[len(specs)], stage.kv.v[len(specs)]
        specs.append(decode_layers.LayerSpec(norms[0].data_ptr(), norms[1].data_ptr(), *linears,
                                             k_cache.data_ptr(), v_cache.data_ptr()))
    shape = decode_layers.ShapeSpec(hidden=config.hidden_size, heads=config.num_heads,
                                    kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                                    intermediate=config.intermediate_size, eps=config.rms_norm_eps, threads=1,
                                    window=config.sliding_window or 0)
    layers = (decode_layers.LayerSpec * len(specs))(*specs)
    return decode_layers.LayerSpecs(layers, shape, [*tensors, stage.kv.k, stage.kv.v])


def takes_step(x: torch.Tensor, plan: AttentionPlan) -> bool:
    """Whether this forward is a decode step the fused path serves: one token per sequence."""
    return plan.max_new == 1 and plan.query_index is None and x.dtype == torch.float32


def _linear_spec(module: nn.Module, tensors: list[torch.Tensor]) -> decode_layers.LinearSpec | None:
    """``module`` as a descriptor for the kernel it already runs on, or None where it runs on torch's."""
    k, n = module.in_features, module.out_features
    if isinstance(module, Int4Linear):
        if not module.cpu_kernel:
            return None
        found = [module.weight, module.scales_and_zeros, module.bias]
        spec = decode_layers.linear_spec(decode_layers.INT4, int4_kernel.KERNEL.function, *found, k, n,
                                         module.group_size, int4_kernel.avx512_available())
    elif isinstance(module, Int8Linear):
        if not module.cpu_kernel or module.group is not None:
            return None
        found = [module.weight, module.scales, module.bias]
        spec = decode_layers.linear_spec(decode_layers.INT8, int8_kernel.KERNEL.function, *found, k, n)
    elif isinstance(module, Linear):
        if not dense_matmul.kernel_enabled(module.weight.dtype):
            return None
        found = [module.weight, None, module.bias]
        function = dense_matmul.kernel_for(module.weight.dtype).function
        spec = decode_layers.linear_spec(decode_layers.DENSE, function, *found, k, n)
    else:
        return None
    tensors.extend(t for t in found if t is not None)
    return spec
