"""A pipeline stage: layers [start, end) of a model, its own KV cache, and a ragged-batch forward.

The first stage also holds the token embedding; the last one the final norm and the lm_head. A stage
is what one worker process serves: it loads only its own tensors, at the precision the plan chose,
and turns a batch of (sequence id, start position, new tokens or hidden states) into hidden states
for the next stage, or into the logits of each sequence's last token if it is the last stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from torch import nn

from contracts.model_config import ModelConfig
from contracts.precision import FULL, Precision
from contracts.profiler import DEFAULT_GROUP_SIZE, head_int8_group

from .dense import Linear, weight_dtype
from .fused_decode import fused_layers, takes_step
from .kernels.decode_layers import LayerSpecs
from .kv_cache import KVCache
from .loading import CheckpointReader, Span, copy_rows_into, load_concatenated
from .model import DecoderLayer, RMSNorm, hf_tensor_names
from .quantize import Int4Linear, Int8Linear, quantized_linear
from .rope import RotaryEmbedding
from .weight_cache import WeightCache, load_through

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class Batch:
    """A ragged batch: the new tokens of many sequences, packed flat in the order of ``seq_ids``.

    Sequence ``i`` contributes ``lengths[i]`` tokens at positions ``start_positions[i] ...``: a prompt
    (or a chunk of one) for prefill, a single token for decode, its last token and the proposals to
    verify after it for a speculative step; all kinds may share one batch. The first stage takes
    ``input_ids`` [tokens] (int64); the others ``hidden`` [tokens, hidden_size]. ``logit_rows[i]``: how
    many of sequence ``i``'s last tokens the last stage returns logits of (None: one each).
    ``scored[i]``: the tokens the first of those rows only score (a prompt's own, for its
    log-probabilities), not sampled; None: none anywhere.
    """

    seq_ids: list[int]
    start_positions: list[int]
    lengths: list[int]
    input_ids: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    logit_rows: list[int] | None = None
    scored: list[list[int]] | None = None
    # The head's span of each traced sequence in its prefill (``traceparent`` by seq id): stage_trace.py.
    traces: dict[int, str] | None = None
    # The tokens a resumed constrained sequence's matcher replays in its prefill (structured.py), by seq id.
    replay: dict[int, list[int]] | None = None

    @classmethod
    def of_tokens(cls, seq_ids: list[int], tokens: list[list[int]], start_positions: list[int],
                  logit_rows: list[int] | None = None, scored: list[list[int]] | None = None) -> "Batch":
        """Pack per-sequence token lists into a flat batch for the first stage."""
        flat = [t for seq in tokens for t in seq]
        lengths = [len(t) for t in tokens]
        return cls(list(seq_ids), list(start_positions), lengths, input_ids=torch.tensor(flat),
                   logit_rows=logit_rows, scored=scored)

    def rows(self) -> list[int]:
        """Logit rows per sequence (``logit_rows``, or one each)."""
        return self.logit_rows or [1] * len(self.seq_ids)

    def sampled_rows(self) -> list[int]:
        """Sampled logit rows per sequence: its last rows, after those it only scores."""
        if self.scored is None:
            return self.rows()
        return [r - len(s) for r, s in zip(self.rows(), self.scored)]

    def produced_positions(self) -> list[int]:
        """The position of the token each sampled row samples, in row order."""
        sampled = self.sampled_rows()
        return [start + n - r + 1 + j for start, n, r in zip(self.start_positions, self.lengths, sampled)
                for j in range(r)]

    def per_sequence(self, values: list) -> list:
        """Values of the sampled rows grouped by sequence: one value where a sequence has one row, a
        list where it has several (a verification's target tokens)."""
        grouped, at = [], 0
        for r in self.sampled_rows():
            grouped.append(values[at] if r == 1 else values[at:at + r])
            at += r
        return grouped

    def with_hidden(self, hidden: torch.Tensor) -> "Batch":
        """The same sequences carrying a previous stage's output, as the next stage receives them."""
        return replace(self, input_ids=None, hidden=hidden)

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class StageMemory:
    """Bytes a loaded stage really holds, for the planner: weights by storage kind, and the KV cache."""

    weight_bytes_by_kind: dict[str, int] = field(default_factory=dict)  # "int8", "int4", "float32", ...
    kv_cache_bytes: int = 0
    kv_bytes_per_token: int = 0
    kv_tokens: int = 0

    @property
    def weight_bytes(self) -> int:
        return sum(self.weight_bytes_by_kind.values())

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes


class Stage(nn.Module):
    """Layers [start, end) of a LLaMA-family model with a KV cache; build it with :meth:`Stage.load`."""

    def __init__(
        self,
        config: ModelConfig,
        start: int,
        end: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        precision: Precision = FULL,
        kv_tokens: int = 4096,
        block_size: int = 16,
        group_size: int = DEFAULT_GROUP_SIZE,
        holds_ends: bool = True,
    ):
        super().__init__()
        if not 0 <= start < end <= config.num_layers:
            raise ValueError(
                f"stage layers [{start}, {end}) are not within the model's {config.num_layers} layers"
            )
        self.layer_bits = precision.layer_bits(start, end)
        self.config, self.start, self.end, self.precision = config, start, end, precision
        self.device = torch.device(device)
        self.dtype = dtype or DTYPES[config.torch_dtype]
        # Where the embedding and the 16-bit layers' linear weights are kept: the checkpoint's own 16 bits on
        # a CPU stage computing in fp32 (dense.weight_dtype); norms, biases, the KV cache stay in self.dtype.
        self.weight_dtype = weight_dtype(DTYPES[config.torch_dtype], self.device, self.dtype)
        self.is_first, self.is_last = start == 0, end == config.num_layers
        self.group_size = group_size
        hidden, vocab = config.hidden_size, config.vocab_size
        with torch.device("meta"):
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(end - start)).to(self.dtype)
            # An empty table, not nn.Embedding's random init: on the meta device normal_ imports
            # torch._dynamo, 2 s of a head's start (an in-place handover's pause) for values never used.
            self.embed = (nn.Embedding(vocab, hidden, _weight=torch.empty(vocab, hidden, dtype=self.dtype))
                          if self.is_first and holds_ends else None)
            head = self.is_last and holds_ends  # False on a tensor-parallel shard but its group's first
            self.norm = RMSNorm(hidden, config.rms_norm_eps).to(self.dtype) if head else None
            self.lm_head = Linear(hidden, vocab, bias=False).to(self.dtype) if head else None
        for layer, layer_bits in zip(self.layers, self.layer_bits):
            if layer_bits == 16:
                continue
            for parent, name in (
                (layer.attention, "wqkv"),
                (layer.attention, "wo"),
                (layer.feed_forward, "w13"),
                (layer.feed_forward, "w2"),
            ):
                setattr(parent, name, self._quantized(getattr(parent, name), layer_bits))
        if self.lm_head is not None and self.head_bits != 16:
            self.lm_head = self._quantized(self.lm_head, self.head_bits, head_int8_group(hidden))
        for module in self.modules() if self.weight_dtype != self.dtype else ():
            if isinstance(module, (Linear, nn.Embedding)):  # quantized linears are neither
                module.weight = nn.Parameter(module.weight.to(self.weight_dtype), requires_grad=False)
        self.to_empty(device=self.device)
        self.rope = RotaryEmbedding(config, self.device)
        self.kv = KVCache(
            end - start,
            config.num_kv_heads,
            config.head_dim,
            kv_tokens,
            block_size=block_size,
            device=self.device,
            dtype=self.dtype,
            sliding_window=config.sliding_window,
        )
        # Decode steps as one C call (fused_decode.py), where the stage qualifies: set once loaded.
        self.fused: LayerSpecs | None = None

    @property
    def head_bits(self) -> int:
        """The lm_head runs at the precision of the stage's last layer (int8 with a scale per group of
        ``contracts.profiler.HEAD_INT8_GROUP`` weights: see ``head_int8_group``)."""
        return self.layer_bits[-1]

    def _quantized(self, linear: nn.Linear, bits: int, int8_group: int | None = None) -> nn.Module:
        return quantized_linear(linear, bits, self.device, self.dtype, self.group_size, int8_group)

    @classmethod
    def load(
        cls,
        model_dir: str | Path,
        start: int,
        end: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype | None = None,
        precision: Precision = FULL,
        kv_tokens: int = 4096,
        block_size: int = 16,
        group_size: int = DEFAULT_GROUP_SIZE,
        weight_cache: str | Path | None = None,
        reuse: "Stage | None" = None,
    ) -> "Stage":
        """Load layers [start, end) of the checkpoint in ``model_dir``, reading only this stage's tensors.

        ``dtype`` defaults to the checkpoint's; ``precision`` at 8 or 4 bits quantizes every linear layer
        of the stage (the lm_head included, the embedding lookup not); with ``low_bits`` and ``low_from``,
        layers [low_from, end) and the lm_head run at ``low_bits`` instead (a plan's stage that mixes
        two precisions); ``kv_tokens`` is the cache budget; ``weight_cache``: a folder where quantized
        layers of a CPU stage are kept for the next process that loads them (weight_cache.py); ``reuse``:
        the stage this process ran until now (given a new spec in place, contracts §1), whose loaded
        modules are taken over where this stage would load them the same way, and which is unusable after.
        """
        config = ModelConfig.from_file(model_dir)
        stage = cls(
            config,
            start,
            end,
            device=device,
            dtype=dtype,
            precision=precision,
            kv_tokens=kv_tokens,
            block_size=block_size,
            group_size=group_size,
        )
        cache = WeightCache(weight_cache, model_dir) if weight_cache and stage.device.type == "cpu" else None
        kept = stage._adopt(reuse)
        with torch.inference_mode(), CheckpointReader(model_dir) as reader:
            stage._load_weights(reader, cache, kept)
        stage.eval()
        stage.fused = fused_layers(stage)
        return stage

    def _adopt(self, old: "Stage | None") -> set[str]:
        """Take over ``old``'s loaded modules that this stage would load the same way: a layer at the same
        precision, the embedding, the final norm and lm_head at the same precision; ``old``'s KV cache
        is dropped first (its sequences end with the old spec). Returns what was taken ("layer3" for
        this stage's layer 3, "embed", "head"): a boundary move reloads one layer, not the stage."""
        if old is None:
            return set()
        old.kv = None
        same = (old.config, old.device, old.dtype, old.weight_dtype, old.group_size) == (
            self.config, self.device, self.dtype, self.weight_dtype, self.group_size)
        if not same:
            return set()
        kept = set()
        for i in range(len(self.layers)):
            j = self.start + i - old.start
            if 0 <= j < len(old.layers) and old.layer_bits[j] == self.layer_bits[i]:
                self.layers[i] = old.layers[j]
                kept.add(f"layer{i}")
        if self.is_first and old.is_first:
            self.embed = old.embed
            kept.add("embed")
        if self.is_last and old.is_last and old.head_bits == self.head_bits:
            self.norm, self.lm_head = old.norm, old.lm_head
            kept.add("head")
        return kept

    def _load_weights(self, reader: CheckpointReader, cache: WeightCache | None = None,
                      kept: set[str] = frozenset()) -> None:
        for i, layer in enumerate(self.layers):
            if f"layer{i}" in kept:
                continue
            load_through(cache if self.layer_bits[i] != 16 else None, f"model.layers.{self.start + i}", layer,
                         lambda i=i, layer=layer: self._load_layer(reader, i, layer))
        if self.embed is not None and "embed" not in kept:
            self._load_into(reader, self.embed, "weight", ["model.embed_tokens.weight"])
        if self.lm_head is not None and "head" not in kept:
            self._load_into(reader, self.norm, "weight", ["model.norm.weight"])
            untied = reader.has("lm_head.weight") and not self.config.tie_word_embeddings
            if not untied and self.embed is not None and self.head_bits == 16:
                self.lm_head.weight = self.embed.weight  # tied: one tensor serves both
            else:
                head = "lm_head.weight" if untied else "model.embed_tokens.weight"
                load_through(cache if self.head_bits != 16 else None, "lm_head", self.lm_head,
                             lambda: self._load_into(reader, self.lm_head, "weight", [head]))

    def _load_layer(self, reader: CheckpointReader, i: int, layer: DecoderLayer) -> None:
        modules = dict(layer.named_modules())
        for ours, theirs in hf_tensor_names(self.start + i).items():
            module_name, attr = ours.rsplit(".", 1)
            self._load_into(reader, modules[module_name], attr, theirs, *self._slices(ours))

    def _slices(self, name: str) -> tuple[list[Span] | None, Span | None]:
        """The rows of each checkpoint tensor and the columns that parameter ``name`` of a layer holds
        (None: all): all of them here; a tensor-parallel shard's share of them."""
        return None, None

    def _load_into(self, reader: CheckpointReader, module: nn.Module, attr: str, names: list[str],
                   rows: list[Span] | None = None, columns: Span | None = None) -> None:
        target = getattr(module, attr)
        if attr == "bias" and target is None:
            return
        if isinstance(module, (Int8Linear, Int4Linear)) and attr == "weight":
            load_concatenated(reader, names, module.load_rows, rows, columns)
            module.finish()
            return
        if target.dtype == self.weight_dtype != self.dtype and reader.dtype(names[0]) != target.dtype:
            # Stored wider (or in the other 16-bit format) than the config's torch_dtype says: widened to
            # self.dtype as it loads, as every tensor was before, rather than rounded to weight_dtype.
            target = nn.Parameter(torch.empty_like(target, dtype=self.dtype), requires_grad=False)
            setattr(module, attr, target)
        load_concatenated(reader, names, copy_rows_into(target), rows, columns)

    @property
    def hidden_dtype(self) -> torch.dtype:
        """The dtype of the hidden states this stage sends (and expects to receive)."""
        return self.dtype

    @torch.inference_mode()
    def forward(self, batch: Batch, all_logits: bool = False) -> torch.Tensor:
        """Run the stage's layers over a ragged batch, appending each sequence's new K/V to the cache.

        Returns contiguous hidden states [tokens, hidden] in :attr:`hidden_dtype`; the last stage
        returns fp32 logits [sequences, vocab] of each sequence's last token (every token with
        ``all_logits``). Raises :class:`~worker_runtime.kv_cache.KVBudgetExceeded` before running
        anything if the cache cannot hold the batch.
        """
        x = self.first_layer_input(batch)
        plan = self.kv.plan(batch.seq_ids, batch.start_positions, batch.lengths)
        cos, sin = self.rope.cos_sin(plan.positions, plan.seq_ends, x.dtype)
        if self.fused is not None and takes_step(x, plan):
            x = self.fused.run(x, cos.view(x.shape[0], -1), sin.view(x.shape[0], -1), plan.write_slots,
                               plan.gather_slots, plan.seq_ends)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, plan, cos, sin, self.kv.k[i], self.kv.v[i])
        return self._output(x, batch, all_logits)

    def close(self) -> None:
        """Release what the stage holds outside its own memory: nothing for one process (a
        tensor-parallel group's rank 0 stops its other ranks: ``LeadStage.close``)."""

    def first_layer_input(self, batch: Batch) -> torch.Tensor:
        """The batch's hidden states as the first layer takes them: embedded tokens on the first stage.
        Checks the batch (ValueError): a tensor-parallel group's rank 0 calls it before the group hears
        of the batch."""
        tokens = batch.input_ids if self.is_first else batch.hidden
        if tokens is None or tokens.shape[0] != batch.num_tokens:
            kind = "input_ids" if self.is_first else "hidden"
            raise ValueError(f"stage [{self.start}, {self.end}) needs {batch.num_tokens} rows of {kind}")
        if self.is_first:
            return self.embed(tokens.to(self.device)).to(self.dtype)
        return tokens.to(device=self.device, dtype=self.dtype)

    def _output(self, x: torch.Tensor, batch: Batch, all_logits: bool) -> torch.Tensor:
        """The last layer's ``x`` as the stage returns it: hidden states, or the last stage's logits."""
        if not self.is_last:
            return x.contiguous()
        if not all_logits:
            x = x.index_select(0, _logit_index(batch).to(self.device))
        return self.lm_head(self.norm(x)).float()

    def memory(self) -> StageMemory:
        """The stage's real bytes: weights by storage kind (tied tensors once) and its KV cache."""
        by_kind: dict[str, int] = {}
        seen: set[int] = set()
        for module in self.modules():
            kind = {Int8Linear: "int8", Int4Linear: "int4"}.get(type(module))
            for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
                if tensor.data_ptr() in seen:
                    continue
                seen.add(tensor.data_ptr())
                key = kind or str(tensor.dtype).removeprefix("torch.")
                by_kind[key] = by_kind.get(key, 0) + tensor.nbytes
        return StageMemory(
            weight_bytes_by_kind=by_kind,
            kv_cache_bytes=self.kv.nbytes,
            kv_bytes_per_token=self.kv.bytes_per_token,
            kv_tokens=self.kv.capacity_tokens,
        )


def _logit_index(batch: Batch) -> torch.Tensor:
    """The flat row of every token whose logits the last stage returns: each sequence's last
    ``batch.rows()`` tokens."""
    ends = torch.tensor(batch.lengths).cumsum(0)
    if batch.logit_rows is None:
        return ends - 1
    rows = torch.tensor(batch.logit_rows)
    first = torch.repeat_interleave(ends - rows, rows)
    offset = torch.arange(int(rows.sum())) - torch.repeat_interleave(rows.cumsum(0) - rows, rows)
    return first + offset
