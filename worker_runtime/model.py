"""A LLaMA-family decoder layer in the gpt-fast style: RMSNorm, RoPE, grouped-query attention, SwiGLU.

Covers LLaMA 1-3, Mistral and Qwen2 (q/k/v biases). q/k/v and gate/up are fused into one matmul each,
which matters on a CPU at batch 1 where every kernel call costs; their matmuls run on
:mod:`worker_runtime.dense`'s kernel choice. Layers work on flat ``[tokens, hidden]``
activations of a ragged batch; attention reads and writes the paged cache through an
:class:`~worker_runtime.kv_cache.AttentionPlan` built once per forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from contracts.model_config import ModelConfig

from .dense import Linear
from .kv_cache import AttentionPlan
from .rope import apply_rotary


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)`` without a dispatched call when it already is: at batch 1 every call costs."""
    return x if x.dtype == dtype else x.to(dtype)


class RMSNorm(nn.Module):
    """Normalizes in fp32 and casts back before the weight, exactly as transformers does."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused rms_norm on fp32 is bit-identical to x * rsqrt(mean(x^2) + eps), in fewer kernels;
        # on fp32 it also applies the weight, bit-identically, in the same call (one kernel, not four).
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        qkv_size = config.q_size + 2 * config.kv_size
        self.wqkv = Linear(config.hidden_size, qkv_size, bias=config.attention_bias)
        # LLaMA's attention_bias also covers o_proj; Qwen2 has biases on q/k/v only.
        o_bias = config.attention_bias and config.model_type != "qwen2"
        self.wo = Linear(config.q_size, config.hidden_size, bias=o_bias)

    def forward(
        self,
        x: torch.Tensor,
        plan: AttentionPlan,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        qkv = self.wqkv(x)
        # q and k lie side by side in qkv: rotate them as one [tokens, heads + kv_heads, head_dim] view.
        qk = apply_rotary(qkv[:, : q_size + kv_size].view(tokens, -1, self.head_dim), cos, sin)
        q, k = qk[:, : self.n_heads], qk[:, self.n_heads :]
        v = qkv[:, q_size + kv_size :].view(tokens, self.n_kv_heads, self.head_dim)
        k_cache.index_copy_(0, plan.write_slots, _as(k, k_cache.dtype))
        v_cache.index_copy_(0, plan.write_slots, _as(v, v_cache.dtype))
        # index_select, not k_cache[slots]: the same gather at a quarter of advanced indexing's cost.
        kv_shape = (plan.batch, -1, self.n_kv_heads, self.head_dim)
        keys = _as(k_cache.index_select(0, plan.gather_slots).view(kv_shape).transpose(1, 2), q.dtype)
        values = _as(v_cache.index_select(0, plan.gather_slots).view(kv_shape).transpose(1, 2), q.dtype)
        if plan.mask is None:  # one new token per sequence, all equally long: no mask, no padding
            return self.wo(self._one_query(q, keys, values))
        if plan.query_index is not None:
            padded = q.new_zeros(plan.batch * plan.max_new, self.n_heads, self.head_dim)
            q = padded.index_copy_(0, plan.query_index, q)
        q = q.view(plan.batch, plan.max_new, self.n_heads, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=plan.mask, enable_gqa=self.n_heads != self.n_kv_heads
        )
        out = out.transpose(1, 2).reshape(plan.batch * plan.max_new, q_size)
        if plan.query_index is not None:
            out = out.index_select(0, plan.query_index)
        return self.wo(out)

    def _one_query(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """Attention of one query row per sequence (decode), no mask.

        ``q`` [batch, heads, head_dim]; ``keys``, ``values`` [batch, kv_heads, length, head_dim]. The query
        heads a kv head serves become that head's query rows, so SDPA runs without GQA's key expansion:
        12 us a layer instead of 15 for SmolLM2's 9 / 3 heads at batch 1 (the same result).
        """
        batch, group = q.shape[0], self.n_heads // self.n_kv_heads
        out = F.scaled_dot_product_attention(q.view(batch, self.n_kv_heads, group, self.head_dim), keys,
                                             values)
        return out.view(batch, self.n_heads * self.head_dim)


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), with gate and up fused into ``w13``."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.w13 = Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.w2 = Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split([self.intermediate, self.intermediate], dim=-1)
        return self.w2(F.silu(gate).mul_(up))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(
        self,
        x: torch.Tensor,
        plan: AttentionPlan,
        cos: torch.Tensor,
        sin: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), plan, cos, sin, k_cache, v_cache)
        return h + self.feed_forward(self.ffn_norm(h))


def hf_tensor_names(layer: int) -> dict[str, list[str]]:
    """Our parameter names in a layer -> the Hugging Face tensors they are made of (row-concatenated)."""
    p = f"model.layers.{layer}."
    return {
        "attention_norm.weight": [p + "input_layernorm.weight"],
        "ffn_norm.weight": [p + "post_attention_layernorm.weight"],
        "attention.wqkv.weight": [p + f"self_attn.{n}_proj.weight" for n in "qkv"],
        "attention.wqkv.bias": [p + f"self_attn.{n}_proj.bias" for n in "qkv"],
        "attention.wo.weight": [p + "self_attn.o_proj.weight"],
        "attention.wo.bias": [p + "self_attn.o_proj.bias"],
        "feed_forward.w13.weight": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "feed_forward.w13.bias": [p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias"],
        "feed_forward.w2.weight": [p + "mlp.down_proj.weight"],
        "feed_forward.w2.bias": [p + "mlp.down_proj.bias"],
    }
