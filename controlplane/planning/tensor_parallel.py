"""Tensor-parallel groups: uneven shares of a stage's layers on two or more cards of one node.

A group stage holds layers [start, end) on every rank: rank r keeps ``kv_heads[r]`` of the model's
key-value heads (with their query heads and their rows of the output projection) and ``columns[r]``
of the MLP's intermediate columns (gate/up columns and down rows), a whole number of quantization
groups, and the same share of the ``lm_head``'s vocabulary on the last stage. A rank's weights,
FLOPs and KV are its fractions of the stage's: attention scales with its heads, the MLP and the head
with its columns (``Layout.attention``: the share of a layer's matmul weights in attention). Each
rank is priced by the cost model's roofline for one stage (``cost_model``: bytes at the bandwidth,
FLOPs at the peak, the per-layer overhead, the calibration at its precision); the group's decode
step is the slowest rank plus two all-reduces of the micro-batch's hidden states per layer (after
attention and after the MLP) and, on the last stage, a gather of the fp32 logits to the first rank.

Collectives over the group's link (the slowest pairwise ``FleetSpec.link_between`` of its cards:
bandwidth ``bw``, latency ``a``), n ranks, B bytes per rank (the alpha-beta model):

    all_reduce(B) = min(ring: 2(n-1) a + 2(n-1)/n B / bw,  one-shot: a + (n-1) B / bw)
    gather(B)     = a + (n-1)/n B / bw

the ring for large messages (prefill), the one-shot (every rank sends its partial sums to every
peer and adds what it receives) for decode's small ones.

Shares: the heads and columns in proportion to each card's speed (its memory bandwidth over its
calibration: decode reads weights), or, where that does not fit a card, to its usable memory;
per range and precision the faster of the two that fits every rank. Each rank gets at least one
head and one block of columns. The embedding stays whole on the first rank, every rank keeps the
workspace (hidden states are replicated) and the last stage's logits.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from contracts.footprint import TensorLayout, rank_footprint, tensor_layout, usable_bytes
from contracts.hardware import DeviceSpec, LinkSpec
from contracts.precision import Precision
from controlplane.planning.plan import Placement, Share, StagePrecision
from controlplane.planning.roofline import (
    DECODE_COMPUTE_EFFICIENCY,
    LAYER_OVERHEAD_S,
    PREFILL_COMPUTE_EFFICIENCY,
    StageFit,
    _peak,
    bandwidth,
    device_key,
    slowdown,
)

GROUP_LINKS = ("nvlink", "pcie")  # links a group's cards may share
LOGIT_BYTES = 4
DEFAULT_BLOCK = 128  # MLP columns per block when the profile names no quantization group


@dataclass(frozen=True)
class Layout(TensorLayout):
    """What the shares split (``contracts.footprint.TensorLayout``), with the MLP columns in blocks."""

    block: int
    query_width: int  # query features per key-value head (columns of the output projection)
    qkv_rows: int  # rows of q, k and v per key-value head


def layout(model) -> Layout | None:
    """The model's layout from its profile; None when it does not say its heads or has too few heads or
    columns to split (no group is then considered)."""
    split = tensor_layout(model)
    if split is None:
        return None
    block = int(((model.extra or {}).get("quantization") or {}).get("group_size") or DEFAULT_BLOCK)
    if split.kv_heads < 2 or split.columns < 2 * block:
        return None
    heads = int(model.extra["num_heads"])  # tensor_layout read it
    head_dim = int(model.extra.get("head_dim") or model.hidden_size // heads)
    per_kv = heads // split.kv_heads
    return Layout(split.kv_heads, split.columns, split.attention, block, per_kv * head_dim,
                  (per_kv + 2) * head_dim)


def _whole(weights: list[float], total: int) -> list[int]:
    """``total`` split in proportion to ``weights``, at least 1 each, by largest remainder."""
    spare = total - len(weights)
    exact = [spare * w / sum(weights) for w in weights]
    parts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))[: spare - sum(parts)]:
        parts[i] += 1
    return [p + 1 for p in parts]


def _ratio(cost, bits: int) -> float:
    """The model's layer bytes at ``bits`` over its bytes at 16: what a parameter costs to read and keep."""
    return float(cost.weights[bits][-1] / cost.weights[16][-1])


def per_rank(bits, ranks: int) -> tuple[int, ...]:
    """``bits`` (one precision, or one per rank) as one per rank."""
    return tuple(bits) if isinstance(bits, tuple) else (bits,) * ranks


def share_candidates(cost, devices: tuple[DeviceSpec, ...], bits, last_bits: int | None = None
                     ) -> tuple[tuple[Share, ...], ...]:
    """The shares considered for a group at ``bits`` (one precision, or one per rank; its layers from
    ``last_bits``' split on at ``last_bits``): by speed (parameters a rank reads per second at its
    precision, with the calibration of its last one), and by parameters its usable memory keeps. A share
    whose rank holds 4-bit layers off the int4 groups (``int4_fits``) is left out."""
    lay = layout(cost.model)
    found: list[tuple[Share, ...]] = []
    ranks = per_rank(bits, len(devices))
    lasts = ranks if last_bits is None else (last_bits,) * len(devices)
    # Bytes per parameter relative to the first rank's (exactly 1 for ranks of one precision).
    ratios = [_ratio(cost, b) / _ratio(cost, ranks[0]) for b in ranks]
    for weights in ([bandwidth(d) / slowdown(d, last) / r for d, last, r in zip(devices, lasts, ratios)],
                    [max(usable_bytes(d), 1) / r for d, r in zip(devices, ratios)]):
        heads = _whole(weights, lay.kv_heads)
        blocks = _whole(weights, lay.columns // lay.block)
        columns = [b * lay.block for b in blocks]
        columns[-1] += lay.columns - sum(columns)
        shares = tuple(Share(d.name, h, c, b) for d, h, c, b in zip(devices, heads, columns, ranks))
        if shares not in found and int4_fits(lay, shares, last_bits):
            found.append(shares)
    return tuple(found)


def int4_fits(lay: Layout, shares: tuple[Share, ...], last_bits: int | None) -> bool:
    """Whether every rank that holds 4-bit layers can: its columns of the output and down projections
    start and end on whole quantization blocks of a matrix the blocks divide (so on the whole matrix's
    int4 groups, as the worker requires: ``worker_runtime/tensor_parallel/shares.py``), and its q/k/v
    and gate/up rows are multiples of 16."""
    heads = columns = 0
    for share in shares:
        spans = ((heads * lay.query_width, (heads + share.kv_heads) * lay.query_width,
                  lay.kv_heads * lay.query_width), (columns, columns + share.columns, lay.columns))
        if 4 in (share.bits, last_bits) and (
                any(at % lay.block for span in spans for at in span)
                or share.kv_heads * lay.qkv_rows % 16 or 2 * share.columns % 16):
            return False
        heads, columns = heads + share.kv_heads, columns + share.columns
    return True


def group_link(cost, devices) -> LinkSpec:
    """The slowest link between two of the group's cards (its collectives wait on it)."""
    links = [cost.link(a, b) for a, b in itertools.permutations(devices, 2)]
    kind = "nvlink" if all(link.kind == "nvlink" for link in links) else "pcie"
    return LinkSpec(devices[0].name, devices[-1].name, kind, min(link.bandwidth_gbs for link in links),
                    max(link.latency_us for link in links))


def can_group(cost, devices) -> bool:
    """Two or more cards of one node, linked pairwise by NVLink or PCIe, no more than the model's
    key-value heads, on a model whose profile says its layout."""
    lay = layout(cost.model)
    return (lay is not None and 2 <= len(devices) <= lay.kv_heads and len({d.node for d in devices}) == 1
            and all(cost.link(a, b).kind in GROUP_LINKS for a, b in itertools.combinations(devices, 2)))


def all_reduce_s(link: LinkSpec, ranks: int, nbytes):
    bw, latency = link.bandwidth_gbs * 1e9, link.latency_us * 1e-6
    ring = 2 * (ranks - 1) * latency + 2 * (ranks - 1) / ranks * nbytes / bw
    return np.minimum(ring, latency + (ranks - 1) * nbytes / bw)


def gather_s(link: LinkSpec, ranks: int, nbytes):
    return link.latency_us * 1e-6 + (ranks - 1) / ranks * nbytes / (link.bandwidth_gbs * 1e9)


def _rank(cost, lay: Layout, share: Share, first: bool, starts, ends, micro_batch: float,
          tokens: float | None, splits=None, low_bits: int | None = None):
    """(seconds, bytes kept) of one rank for stages [starts, ends): [starts, splits) at ``share.bits``,
    [splits, ends) and the head at ``low_bits`` (``splits``: ``ends`` when None); ``tokens``: a prefill
    of that many tokens instead of a decode step. The bytes are ``contracts.footprint.rank_footprint``'s
    with the workload's KV, for every range at once."""
    device, b = cost.device(share.device), share.bits
    low = b if low_bits is None else low_bits
    splits = ends if splits is None else splits
    heads, cols, part = lay.fractions(share.kv_heads, share.columns)
    last = ends == cost.num_layers
    layers = (cost.weights[b][splits] - cost.weights[b][starts]
              + cost.weights[low][ends] - cost.weights[low][splits])
    head = np.where(splits < ends, cost.head_bytes[low], cost.head_bytes[b])
    weights = layers * part + head * cols * last
    kv = (cost.kv[ends] - cost.kv[starts]) * heads
    matmul = (cost.flops[ends] - cost.flops[starts]) * part
    attention = (cost.attn[ends] - cost.attn[starts]) * heads
    if tokens is None:
        flops = micro_batch * (matmul + cost.head_flops * cols * last + attention * cost.kv_context)
        busy = np.maximum((weights + kv * micro_batch * cost.kv_context) / bandwidth(device),
                          flops / (_peak(device) * DECODE_COMPUTE_EFFICIENCY))
    else:
        flops = tokens * matmul + cost.head_flops * cols * last + attention * tokens * tokens / 2.0
        busy = np.maximum(flops / (_peak(device) * PREFILL_COMPUTE_EFFICIENCY), weights / bandwidth(device))
    # As on one card, a stage with layers at ``low_bits`` takes that precision's calibration.
    factor = np.where(splits < ends, slowdown(device, low), slowdown(device, b))
    seconds = (busy + (ends - starts) * LAYER_OVERHEAD_S) * factor
    stored = np.round(weights + cost.embedding_bytes * (starts == 0) * first)  # whole bytes, as the rank's
    return seconds, stored + np.round(kv) * cost.kv_required + cost.workspace + cost.logits * last


def _priced(cost, shares: tuple[Share, ...], starts, ends, micro_batch: float, tokens: float | None = None,
            splits=None, low_bits: int | None = None):
    """Step (or prefill) seconds of the group with these shares, inf where a rank does not fit;
    ``splits`` and ``low_bits`` as for ``_rank``."""
    lay = layout(cost.model)
    devices = [cost.device(s.device) for s in shares]
    link = group_link(cost, devices)
    slowest, fits, alike = 0.0, ends > starts, set()
    for index, share in enumerate(shares):
        key = (device_key(devices[index]), share.kv_heads, share.columns, share.bits, index == 0)
        if key in alike:  # a rank like one priced already (even shares of equal cards) changes nothing
            continue
        alike.add(key)
        seconds, kept = _rank(cost, lay, share, index == 0, starts, ends, micro_batch, tokens, splits,
                                 low_bits)
        slowest = np.maximum(slowest, seconds)
        fits = fits & (kept <= usable_bytes(devices[index]))
    moved = micro_batch if tokens is None else tokens
    reduce = (ends - starts) * 2 * all_reduce_s(link, len(shares), moved * cost.activation_bytes)
    sampled = 1 if tokens is not None else moved  # a prefill samples its last token only
    logits = gather_s(link, len(shares), sampled * cost.model.vocab_size * LOGIT_BYTES)
    return np.where(fits, slowest + reduce + logits * (ends == cost.num_layers), np.inf)


def group_matrix(cost, devices: tuple[DeviceSpec, ...], bits, micro_batch: float) -> np.ndarray:
    """M[i, j] = decode step of layers [i, j) at ``bits`` (one precision, or one per rank) on the group,
    over its share candidates (the faster that fits); inf where none fits."""
    def make():
        n = cost.num_layers + 1
        starts, ends = np.arange(n)[:, None], np.arange(n)[None, :]
        best = np.full((n, n), np.inf)
        for shares in share_candidates(cost, devices, bits):
            best = np.minimum(best, _priced(cost, shares, starts, ends, micro_batch))
        best.setflags(write=False)
        return best
    return cost.remember(("group", tuple(d.name for d in devices), bits, micro_batch), make)


def split_cells(layers: int) -> np.ndarray:
    """The flat indices of (i, s, j) in an (n, n, n) array, n = layers + 1, with i <= s < j."""
    n = layers + 1
    i, s, j = np.arange(n)[:, None, None], np.arange(n)[None, :, None], np.arange(n)[None, None, :]
    return np.flatnonzero((i <= s) & (s < j))


def group_split_matrix(cost, devices: tuple[DeviceSpec, ...], low_bits: int,
                       micro_batch: float) -> np.ndarray:
    """Per (i, s, j) of ``split_cells``: the decode step of layers [i, j) with [i, s) at 16 bits and
    [s, j) at ``low_bits`` (s = i: all of them) on the group, over its share candidates; inf where
    none fits."""
    def make():
        cells = split_cells(cost.num_layers)
        starts, splits, ends = np.unravel_index(cells, (cost.num_layers + 1,) * 3)
        best = np.full(len(cells), np.inf)
        for shares in share_candidates(cost, devices, 16, low_bits):
            best = np.minimum(best, _priced(cost, shares, starts, ends, micro_batch, None, splits, low_bits))
        best.setflags(write=False)
        return best
    return cost.remember(("group split", tuple(d.name for d in devices), low_bits, micro_batch), make)


def group_placement(cost, devices, start: int, end: int, bits, micro_batch: float,
                    low_bits: int | None = None, low_from: int | None = None) -> Placement:
    """The placement of a group stage with the shares ``group_matrix`` (or, with ``low_bits`` from
    ``low_from``, ``group_split_matrix``) priced it at; ``bits`` one precision or one per rank, the
    stage's ``bits`` its first rank's; every rank holds the same split."""
    options = share_candidates(cost, devices, bits, low_bits)
    split = end if low_from is None else low_from
    times = [float(_priced(cost, s, np.array(start), np.array(end), micro_batch, None, np.array(split),
                           low_bits)) for s in options]
    shares = options[int(np.argmin(times))]
    return Placement(devices[0].name, start, end, shares[0].bits, low_bits, low_from, group=shares)


def _split(stage: StagePrecision):
    return np.array(stage.split), stage.low_bits if stage.split < stage.end else None


def group_decode_s(cost, stage: StagePrecision, micro_batch: float) -> float:
    return float(_priced(cost, stage.group, np.array(stage.start), np.array(stage.end), micro_batch, None,
                         *_split(stage)))


def group_prefill_s(cost, stage: StagePrecision, tokens: int) -> float:
    return float(_priced(cost, stage.group, np.array(stage.start), np.array(stage.end), 1.0, tokens,
                         *_split(stage)))


@dataclass(frozen=True)
class GroupFit:
    """A group stage's footprints, one per rank (``StageFit``s), read as one stage: bytes summed over
    the ranks, the KV tokens every rank can cache for its heads."""

    ranks: tuple

    @property
    def weights_bytes(self) -> int:
        return sum(r.weights_bytes for r in self.ranks)

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(r.kv_bytes_per_token for r in self.ranks)

    @property
    def workspace_bytes(self) -> int:
        return sum(r.workspace_bytes for r in self.ranks)

    @property
    def capacity_bytes(self) -> int:
        return sum(r.capacity_bytes for r in self.ranks)

    @property
    def kv_tokens(self) -> int:
        return min(r.kv_tokens for r in self.ranks)

    def holding(self, kv_tokens: int) -> int:
        """Bytes the group needs for ``kv_tokens``: summed, or beyond the usable memory where any rank
        overflows its own (so one comparison with ``capacity_bytes`` reads as every rank's)."""
        if any(r.holding(kv_tokens) > r.capacity_bytes for r in self.ranks):
            return self.capacity_bytes + max(r.holding(kv_tokens) - r.capacity_bytes for r in self.ranks)
        return sum(r.holding(kv_tokens) for r in self.ranks)


def group_fit(cost, stage: StagePrecision) -> GroupFit:
    """Each rank's ``contracts.footprint.rank_footprint`` against its card's usable memory: the bytes the
    agent admits the rank by (``_rank`` prices every range with the same sums)."""
    return GroupFit(tuple(
        StageFit(rank_footprint(cost.model, stage.start, stage.end,
                                Precision(share.bits, stage.low_bits, stage.low_from),
                                kv_heads=share.kv_heads, intermediate=share.columns, first=index == 0,
                                batch=cost.batch),
                 usable_bytes(cost.device(share.device)))
        for index, share in enumerate(stage.group)))


def group_resource(cost, stage: StagePrecision, micro_batch: float) -> str:
    """What bounds a group's step: its collectives, or its slowest rank's memory bandwidth or compute."""
    lay = layout(cost.model)
    devices = [cost.device(s.device) for s in stage.group]
    start, end = np.array(stage.start), np.array(stage.end)
    ranks = [_rank(cost, lay, s, i == 0, start, end, micro_batch, None, *_split(stage))[0]
             for i, s in enumerate(stage.group)]
    reduce = (stage.end - stage.start) * 2 * float(all_reduce_s(group_link(cost, devices), len(devices),
                                                                micro_batch * cost.activation_bytes))
    if reduce >= max(ranks):
        return "all-reduce"
    slow = stage.group[int(np.argmax(ranks))]
    device = cost.device(slow.device)
    # The rank's share scales its bytes and FLOPs alike: the whole stage's ratio is the rank's.
    flops_s = micro_batch * float(cost.flops[stage.end] - cost.flops[stage.start]) / (
        _peak(device) * DECODE_COMPUTE_EFFICIENCY)
    low = stage.low_bits if stage.split < stage.end else slow.bits
    read_s = float(cost.weights[slow.bits][stage.split] - cost.weights[slow.bits][stage.start]
                   + cost.weights[low][stage.end] - cost.weights[low][stage.split]) / bandwidth(device)
    return "memory bandwidth" if read_s >= flops_s else "compute"
