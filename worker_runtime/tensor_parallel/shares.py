"""Which part of every layer of a stage each rank of a tensor-parallel group holds, and at what precision.

Attention is split by whole key-value head groups: rank r holds kv heads [a, b) and the query heads that
attend with them, so its attention needs nothing from the others until the output projection. The MLP is
split by blocks of the intermediate dimension: rank r holds those rows of gate and up and those columns of
down. q/k/v and gate/up are column-parallel (rows of the weight: output features), the output and down
projections row-parallel (columns of the weight: input features), so each rank's attention and MLP give a
partial sum of the whole layer's, completed by one all-reduce each.

Shares may be uneven (3 kv heads of 4 on one rank, 1 on another; 70 / 30 of the MLP), and each rank has its
own :class:`~contracts.precision.Precision`. A rank at 4 bits needs its column slices of the output and down
projections to start and end on the int4 groups of the whole matrix, so its groups, scales and zeros are the
whole matrix's; int8 is per output row (the rows of a row-parallel slice are quantized whole, see
``Int8Linear.load_rows``), so any block suits it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from contracts.model_config import ModelConfig
from contracts.precision import FULL, Precision
from contracts.profiler import DEFAULT_GROUP_SIZE

from ..loading import Span
from ..quantize import QuantizationError, pick_group_size


@dataclass(frozen=True)
class Share:
    """Rank ``rank``'s share of every layer of a stage: kv heads [a, b), intermediate columns [c, d)."""

    rank: int
    kv_heads: Span
    intermediate: Span
    precision: Precision = FULL

    @property
    def holds_ends(self) -> bool:
        """The group's first rank holds the embedding, the final norm and lm_head, and the biases of the
        row-parallel projections (added once, not once per rank)."""
        return self.rank == 0

    def config(self, model: ModelConfig) -> ModelConfig:
        """``model`` as this share's modules are built: its heads and its part of the MLP."""
        kv = self.kv_heads[1] - self.kv_heads[0]
        return replace(model, num_kv_heads=kv, num_heads=kv * (model.num_heads // model.num_kv_heads),
                       intermediate_size=self.intermediate[1] - self.intermediate[0])

    def query_columns(self, model: ModelConfig) -> Span:
        """This share's query features (rows of q, columns of the output projection)."""
        width = model.num_heads // model.num_kv_heads * model.head_dim
        return self.kv_heads[0] * width, self.kv_heads[1] * width

    def slices(self, model: ModelConfig, name: str) -> tuple[list[Span] | None, Span | None]:
        """The rows of each checkpoint tensor and the columns that a layer's parameter ``name``
        (``model.hf_tensor_names``) holds in this share; None: all."""
        a, b = self.kv_heads
        kv = (a * model.head_dim, b * model.head_dim)
        if name.startswith("attention.wqkv."):
            return [self.query_columns(model), kv, kv], None
        if name == "attention.wo.weight":
            return None, self.query_columns(model)
        if name.startswith("feed_forward.w13."):
            return [self.intermediate, self.intermediate], None
        if name == "feed_forward.w2.weight":
            return None, self.intermediate
        return None, None  # the norms; the row-parallel biases, whole on the first rank


def split_shares(model: ModelConfig, start: int, end: int, kv_heads: Sequence[int],
                 intermediate: Sequence[int], precisions: Sequence[Precision] | None = None,
                 group_size: int = DEFAULT_GROUP_SIZE) -> list[Share]:
    """The shares of layers [start, end) among ``len(kv_heads)`` ranks: rank r holds ``kv_heads[r]`` kv
    heads and ``intermediate[r]`` columns of the MLP, in rank order, at ``precisions[r]`` (default 16 bits).

    ValueError names the problem: counts that do not add up to the model's or leave a rank empty, or a
    4-bit rank whose column slices do not fall on the whole matrices' int4 groups.
    """
    ranks = len(kv_heads)
    precisions = list(precisions or [FULL] * ranks)
    if not ranks or len(intermediate) != ranks or len(precisions) != ranks:
        raise ValueError(f"shares: {ranks} kv head counts, {len(intermediate)} intermediate blocks and "
                         f"{len(precisions)} precisions; one of each per rank")
    for what, counts, total in (("kv_heads", kv_heads, model.num_kv_heads),
                                ("intermediate", intermediate, model.intermediate_size)):
        if sum(counts) != total or min(counts) < 1:
            raise ValueError(f"shares: {what} {list(counts)} must be positive and add up to the "
                             f"model's {total}")
    shares, kv_at, mlp_at = [], 0, 0
    for rank, (kv, mlp, precision) in enumerate(zip(kv_heads, intermediate, precisions)):
        share = Share(rank, (kv_at, kv_at + kv), (mlp_at, mlp_at + mlp), precision)
        if 4 in precision.layer_bits(start, end):
            _check_int4(model, share, group_size)
        shares.append(share)
        kv_at, mlp_at = kv_at + kv, mlp_at + mlp
    return shares


def _check_int4(model: ModelConfig, share: Share, group_size: int) -> None:
    """A 4-bit share's column slices on the whole matrices' int4 groups, its row counts on the kernel's 16."""
    for what, (first, last), features in (("output projection", share.query_columns(model), model.q_size),
                                          ("down projection", share.intermediate, model.intermediate_size)):
        group = pick_group_size(features, group_size)
        if first % group or last % group or pick_group_size(last - first, group_size) != group:
            raise QuantizationError(f"rank {share.rank} at 4 bits: its {what} columns [{first}, {last}) are "
                                    f"not whole int4 groups of {group}")
    shard = share.config(model)
    for what, rows in (("q/k/v", shard.q_size + 2 * shard.kv_size), ("gate/up", 2 * shard.intermediate_size)):
        if rows % 16:
            raise QuantizationError(f"rank {share.rank} at 4 bits: {rows} {what} rows, not a multiple of 16")
