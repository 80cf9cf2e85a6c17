"""One rank's shard of a tensor-parallel pipeline stage: layers [start, end), the heads and MLP columns of
its :class:`~.shares.Share`, at its own precision, with a KV cache for its kv heads only.

A shard is a :class:`~worker_runtime.stage.Stage` built from the share's shape of the model (its heads,
its part of the MLP), so its attention, MLP, quantized layers and KV cache are the stage's own modules; it
loads only its slices of each checkpoint tensor (an int8 rank reads the whole rows of the output and down
projections to quantize them with the whole rows' scales, and keeps its columns). Its forward adds the
group's reductions around them, per layer::

    h = x + all_reduce(wo_r(attention_r(norm(x))))       # rank r's heads, its rows of wo
    x = h + all_reduce(down_r(silu(gate_r(n)) * up_r(n)))  # n = norm(h); rank r's MLP columns

The residual stream is whole on every rank. The group's first rank (rank 0) holds the ends: it takes the
batch's input (token ids, embedded with its embedding, on a first stage; the previous stage's hidden states
otherwise) and broadcasts it to the others, which need the batch's sequences, positions and lengths only;
on a last stage it alone holds the final norm and the lm_head (at its own precision) and returns the logits.
Rank 0 returns the stage's output (hidden states or logits), the other ranks None. Every rank must be
called with the same batches in the same order: their block tables then stay the same.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from torch import nn

from contracts.model_config import ModelConfig
from contracts.profiler import DEFAULT_GROUP_SIZE

from ..loading import CheckpointReader, Span, load_concatenated
from ..quantize import Int8Linear
from ..stage import Batch, Stage
from .group import ShardGroup
from .shares import Share


class StageShard(Stage):
    """Rank ``share.rank``'s shard of layers [start, end); build it with :meth:`StageShard.load`."""

    def __init__(self, model: ModelConfig, start: int, end: int, share: Share, group: ShardGroup, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype | None = None, kv_tokens: int = 4096,
                 block_size: int = 16, group_size: int = DEFAULT_GROUP_SIZE):
        super().__init__(share.config(model), start, end, device=device, dtype=dtype,
                         precision=share.precision, kv_tokens=kv_tokens, block_size=block_size,
                         group_size=group_size, holds_ends=share.holds_ends)
        self.model, self.share, self.group = model, share, group
        if not share.holds_ends:  # the row-parallel biases are added once, by rank 0
            for layer in self.layers:
                layer.attention.wo.bias = None
                layer.feed_forward.w2.bias = None

    @classmethod
    def load(cls, model_dir: str | Path, start: int, end: int, share: Share, group: ShardGroup, *,
             device: torch.device | str = "cpu", dtype: torch.dtype | None = None, kv_tokens: int = 4096,
             block_size: int = 16, group_size: int = DEFAULT_GROUP_SIZE) -> "StageShard":
        """Load ``share`` of layers [start, end) of the checkpoint in ``model_dir`` (only its slices)."""
        shard = cls(ModelConfig.from_file(model_dir), start, end, share, group, device=device, dtype=dtype,
                    kv_tokens=kv_tokens, block_size=block_size, group_size=group_size)
        with torch.inference_mode(), CheckpointReader(model_dir) as reader:
            shard._load_weights(reader)
        return shard.eval()

    def _slices(self, name: str) -> tuple[list[Span] | None, Span | None]:
        return self.share.slices(self.model, name)

    def _load_into(self, reader: CheckpointReader, module: nn.Module, attr: str, names: list[str],
                   rows: list[Span] | None = None, columns: Span | None = None) -> None:
        if columns is not None and attr == "weight" and isinstance(module, Int8Linear):
            # Whole rows read and quantized with their own scales, this share's columns kept.
            load_concatenated(reader, names, partial(module.load_rows, columns=slice(*columns)), rows)
            return
        super()._load_into(reader, module, attr, names, rows, columns)

    @torch.inference_mode()
    def forward(self, batch: Batch, all_logits: bool = False) -> torch.Tensor | None:
        """The stage's forward over ``batch`` (``Stage.forward``), its layers split over the group: rank 0
        returns the hidden states or logits, the others None. Only rank 0's ``input_ids`` / ``hidden`` are
        read. A :class:`~worker_runtime.kv_cache.KVBudgetExceeded` is raised on every rank alike (all ranks
        have the same ``kv_tokens``), before any collective."""
        return self.run(self.first_layer_input(batch) if self.share.holds_ends else None, batch, all_logits)

    @torch.inference_mode()
    def run(self, x: torch.Tensor | None, batch: Batch, all_logits: bool = False) -> torch.Tensor | None:
        """:meth:`forward` from the batch's input ``x`` as the first layer takes it (rank 0's; None on the
        others): rank 0 checks and embeds its input before the group hears of the batch."""
        if x is None:
            x = torch.empty(batch.num_tokens, self.config.hidden_size, dtype=self.dtype, device=self.device)
        plan = self.kv.plan(batch.seq_ids, batch.start_positions, batch.lengths)
        x = self.group.broadcast(x)
        cos, sin = self.rope.cos_sin(plan.positions, plan.seq_ends, x.dtype)
        for i, layer in enumerate(self.layers):
            attention = layer.attention(layer.attention_norm(x), plan, cos, sin, self.kv.k[i], self.kv.v[i])
            h = x + self.group.all_reduce(attention)
            x = h + self.group.all_reduce(layer.feed_forward(layer.ffn_norm(h)))
        return self._output(x, batch, all_logits) if self.share.holds_ends else None
