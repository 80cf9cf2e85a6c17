"""Rotary position embeddings, including the ``rope_scaling`` variants found in published configs.

The frequencies follow Hugging Face's definitions exactly (default, linear, dynamic NTK, llama3, yarn),
because a stage's logits are checked against transformers within 1e-4. Cos/sin are computed per token
from explicit positions, so a flat batch of many sequences at different positions needs no padding.
"""

from __future__ import annotations

import math

import torch

from contracts.model_config import ModelConfig


class RotaryEmbedding:
    """Cos/sin tables for a list of positions; holds only the inverse frequencies (a few hundred floats)."""

    def __init__(self, config: ModelConfig, device: torch.device):
        self.dim = config.head_dim
        self.base = config.rope_theta
        self.scaling = config.rope_scaling or {"rope_type": "default"}
        self.rope_type = self.scaling["rope_type"]
        self.max_positions = config.max_position_embeddings
        self.device = device
        self.inv_freq, self.attention_factor = self._parameters()

    def _exponents(self) -> torch.Tensor:
        steps = torch.arange(0, self.dim, 2, dtype=torch.int64).to(device=self.device, dtype=torch.float)
        return steps / self.dim

    def _default_inv_freq(self, base: float) -> torch.Tensor:
        return 1.0 / (base ** self._exponents())

    def _parameters(self) -> tuple[torch.Tensor, float]:
        inv_freq = self._default_inv_freq(self.base)
        if self.rope_type == "linear":
            return inv_freq / self.scaling["factor"], 1.0
        if self.rope_type == "llama3":
            return self._llama3(inv_freq), 1.0
        if self.rope_type == "yarn":
            return self._yarn()
        return inv_freq, 1.0  # default; dynamic starts from the default and grows per sequence

    def _llama3(self, inv_freq: torch.Tensor) -> torch.Tensor:
        s = self.scaling
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old_context = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_context / high) * ~(wavelen > old_context / low)
        return torch.where(is_medium, smoothed, scaled)

    def _yarn(self) -> tuple[torch.Tensor, float]:
        s = self.scaling
        factor = s["factor"]
        original = s.get("original_max_position_embeddings") or self.max_positions

        def mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = s.get("attention_factor")
        if attention_factor is None:
            if s.get("mscale") and s.get("mscale_all_dim"):
                attention_factor = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
            else:
                attention_factor = mscale(factor)
        beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

        def correction_dim(rotations: float) -> float:
            return (self.dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(self.base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if s.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, self.dim - 1)
        if low == high:
            high += 0.001
        pos_freqs = self.base ** self._exponents()
        ramp = ((torch.arange(self.dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        extrapolation = (1 - ramp).to(self.device)
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
        return inv_freq, float(attention_factor)

    def _dynamic_inv_freq(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """Per-token frequencies for dynamic NTK: each sequence scales by the end of its current chunk.

        transformers rescales by the longest position of the forward call; per sequence is the same for
        one sequence and, unlike per call, keeps a sequence's result independent of its batch mates.
        """
        factor = self.scaling["factor"]
        seq_lens = seq_lens.clamp(min=self.max_positions).to(torch.float)
        stretch = (factor * seq_lens / self.max_positions) - (factor - 1)
        base = self.base * stretch ** (self.dim / (self.dim - 2))
        return 1.0 / (base[:, None] ** self._exponents()[None, :])

    def cos_sin(
        self, positions: torch.Tensor, seq_ends: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cos and signed sin [tokens, 1, head_dim] (broadcast over heads) for flat ``positions``.

        ``seq_ends``: each token's sequence end. The sin's first half is negated, which is what
        :func:`apply_rotary` needs to rotate with one ``roll`` instead of slicing and concatenating.
        """
        if self.rope_type == "dynamic" and bool((seq_ends > self.max_positions).any()):
            freqs = positions[:, None].float() * self._dynamic_inv_freq(seq_ends)
        else:
            freqs = positions[:, None].float() * self.inv_freq[None, :]
        half_cos, half_sin = freqs.cos() * self.attention_factor, freqs.sin() * self.attention_factor
        cos = torch.cat((half_cos, half_cos), dim=-1)[:, None, :]
        sin = torch.cat((-half_sin, half_sin), dim=-1)[:, None, :]
        return cos.to(dtype), sin.to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [tokens, heads, head_dim] in the rotate-half layout, as transformers does.

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = [-x2, x1]`` equals
    ``x * cos + [x2, x1] * [-sin1, sin2]`` exactly, and ``[x2, x1]`` is one ``roll``.
    """
    return torch.addcmul(x * cos, torch.roll(x, x.shape[-1] // 2, dims=-1), signed_sin)
