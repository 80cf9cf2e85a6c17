"""Measured quality: how far each layer at int8/int4 moves the model's next-token distributions.

``measure_quality(model_dir)`` runs the whole model in one process, as single-layer
:class:`~worker_runtime.stage.Stage` segments chained like a pipeline, on a calibration text (by
default the Apache-2.0 license text the project ships under ``examples/calibration``):

- the fp32 reference: next-token distributions on the calibration part, and the hidden state at
  every layer boundary (cached, so "only layer l quantized" reruns layers l.. and not the prefix);
- per layer l and bits b in (8, 4): the model with only layer l at b bits (the last layer's b
  includes the lm_head, as a plan's stage runs its head at its last layer's precision), the mean
  KL(reference || quantized) over the calibration tokens and the perplexity there;
- per precision (fp32, bf16, int8, int4 with the stage's group size): the whole model's perplexity
  on the held-out part of the text.

The text is tokenized with the model's ``tokenizer.json`` (``tokenizers``); a model without one (a
bare generated checkpoint) reads the text's bytes modulo its vocabulary, which is still a fixed,
reproducible input. Windows of ``window`` tokens are independent sequences of one ragged batch.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from contracts.model_config import ModelConfig
from contracts.precision import Precision
from contracts.profiler import DEFAULT_GROUP_SIZE

from .stage import Batch, Stage

CALIBRATION_TEXT = Path(__file__).resolve().parent.parent / "examples" / "calibration" / "apache-2.0.txt"
QUANTIZED_BITS = (8, 4)


@dataclass
class QualityReport:
    """What ``profile_quality`` stores with a model (``to_dict`` is the JSON shape, bits as strings)."""

    text: str
    calibration_tokens: int
    held_tokens: int
    window: int
    group_size: int
    perplexity: dict[str, float]  # held-out text, whole model: "fp32", "bf16", "int8", "int4"
    reference_perplexity: float  # calibration text, fp32: the base of ``layer_perplexity``
    layer_kl: dict[int, list[float]]  # bits -> mean KL(fp32 || only layer l at bits), nats per token
    layer_perplexity: dict[int, list[float]]  # bits -> calibration perplexity with only layer l at bits
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layer_kl"] = {str(b): v for b, v in self.layer_kl.items()}
        data["layer_perplexity"] = {str(b): v for b, v in self.layer_perplexity.items()}
        return data

    def sensitivity(self) -> dict[int, tuple[float, ...]]:
        """The planner's per-layer cost of running a layer at each low precision (KL, nats per token)."""
        return {b: tuple(v) for b, v in self.layer_kl.items()}


def tokenize(model_dir: str | Path, text: str, vocab_size: int) -> list[int]:
    """The text's token ids; the layout's padding (a license's centred titles) is dropped first."""
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(line.strip() for line in text.splitlines()))
    tokenizer_file = Path(model_dir) / "tokenizer.json"
    if tokenizer_file.is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(tokenizer_file)).encode(text, add_special_tokens=False).ids
    return [b % vocab_size for b in text.encode()]


def _windows(ids: list[int], window: int) -> list[list[int]]:
    return [ids[i : i + window] for i in range(0, len(ids) - 1, window) if len(ids[i : i + window]) > 1]


class _Chain:
    """Single-layer stages of one precision (the first holds the embedding, the last the head)."""

    def __init__(self, model_dir: Path, config: ModelConfig, kv_tokens: int, group_size: int, **kwargs):
        self.stages = [
            Stage.load(model_dir, layer, layer + 1, kv_tokens=kv_tokens, group_size=group_size, **kwargs)
            for layer in range(config.num_layers)
        ]


def _run(stages: list[Stage], batch: Batch, x: torch.Tensor | None, boundaries: list | None = None):
    """Chain ``stages`` over ``batch`` (first stage: token ids; else hidden ``x``); fp32 logits of all tokens.
    Appends every stage's input to ``boundaries`` when given. Each stage's cache is emptied after."""
    for stage in stages:
        if boundaries is not None:
            boundaries.append(x)
        step = batch if stage.is_first else batch.with_hidden(x)
        x = stage(step, all_logits=True)
        for seq in batch.seq_ids:
            stage.kv.free(seq)
    return x


def _scores(logits: torch.Tensor, targets: torch.Tensor, ref_logp: torch.Tensor | None):
    """(perplexity, mean KL(ref || this)) over the predicted positions."""
    logp = F.log_softmax(logits, dim=-1)
    nll = -logp.gather(1, targets[:, None]).mean().item()
    kl = None if ref_logp is None else max(0.0, (ref_logp.exp() * (ref_logp - logp)).sum(-1).mean().item())
    return math.exp(nll), kl


def _predicted(windows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Row mask of positions that predict a next token in their window, and those next tokens."""
    mask, targets = [], []
    for w in windows:
        mask += [True] * (len(w) - 1) + [False]
        targets += w[1:]
    return torch.tensor(mask), torch.tensor(targets)


def measure_quality(
    model_dir: str | Path,
    *,
    text_file: str | Path | None = None,
    tokens: int = 1024,
    held_tokens: int | None = None,
    window: int = 256,
    group_size: int = DEFAULT_GROUP_SIZE,
    layers: list[int] | None = None,
    progress=None,
) -> QualityReport:
    """Measure per-layer sensitivities and whole-model perplexities (see module doc).

    ``tokens`` calibration tokens (the text's start) and up to ``held_tokens`` held-out tokens (the
    rest; all of it by default); ``layers`` limits the per-layer sweep (all by default).
    """
    began = time.perf_counter()
    model_dir = Path(model_dir)
    text_path = Path(text_file) if text_file else CALIBRATION_TEXT
    config = ModelConfig.from_file(model_dir)
    ids = tokenize(model_dir, text_path.read_text(), config.vocab_size)
    if len(ids) < 2 * window and len(ids) < tokens + 2:
        raise ValueError(f"{text_path}: {len(ids)} tokens; the measurement needs more text")
    calib_ids = ids[:tokens]
    held_ids = ids[tokens:] if held_tokens is None else ids[tokens : tokens + held_tokens]
    if len(held_ids) < 2:
        raise ValueError(f"{text_path}: no held-out text left after {tokens} calibration tokens")
    window = min(window, config.max_position_embeddings)
    # Whole 16-token pages per window: the tokens plus at most one partial page each.
    kv_tokens = max(len(calib_ids), len(held_ids)) + 16 * (max(len(calib_ids), len(held_ids)) // window + 2)
    say = progress or (lambda _message: None)

    def batch_of(windows: list[list[int]]) -> Batch:
        return Batch.of_tokens(list(range(len(windows))), windows, [0] * len(windows))

    calib_w, held_w = _windows(calib_ids, window), _windows(held_ids, window)
    calib_batch, held_batch = batch_of(calib_w), batch_of(held_w)
    calib_mask, calib_targets = _predicted(calib_w)
    held_mask, held_targets = _predicted(held_w)

    perplexity: dict[str, float] = {}
    variants = {"fp32": {"dtype": torch.float32}, "bf16": {"dtype": torch.bfloat16},
                "int8": {"dtype": torch.float32, "precision": Precision(8)},
                "int4": {"dtype": torch.float32, "precision": Precision(4)}}
    for label, kwargs in variants.items():
        chain = _Chain(model_dir, config, kv_tokens, group_size, **kwargs)
        logits = _run(chain.stages, held_batch, None)
        perplexity[label] = _scores(logits[held_mask], held_targets, None)[0]
        say(f"whole model {label}: held-out perplexity {perplexity[label]:.4f}")
        if label == "fp32":
            reference = chain
        else:
            del chain

    boundaries: list = []
    ref_logits = _run(reference.stages, calib_batch, None, boundaries)[calib_mask]
    ref_logp = F.log_softmax(ref_logits, dim=-1)
    reference_perplexity = _scores(ref_logits, calib_targets, None)[0]
    sweep = range(config.num_layers) if layers is None else layers
    layer_kl = {b: [0.0] * config.num_layers for b in QUANTIZED_BITS}
    layer_ppl = {b: [reference_perplexity] * config.num_layers for b in QUANTIZED_BITS}
    for b in QUANTIZED_BITS:
        for layer in sweep:
            low = Stage.load(model_dir, layer, layer + 1, dtype=torch.float32, precision=Precision(b),
                             kv_tokens=kv_tokens, group_size=group_size)
            logits = _run([low, *reference.stages[layer + 1 :]], calib_batch, boundaries[layer])[calib_mask]
            layer_ppl[b][layer], layer_kl[b][layer] = _scores(logits, calib_targets, ref_logp)
            say(f"layer {layer} at int{b}: KL {layer_kl[b][layer]:.3e}, perplexity {layer_ppl[b][layer]:.4f}")
    return QualityReport(
        text=text_path.name, calibration_tokens=len(calib_ids), held_tokens=len(held_ids), window=window,
        group_size=group_size, perplexity=perplexity, reference_perplexity=reference_perplexity,
        layer_kl=layer_kl, layer_perplexity=layer_ppl, seconds=time.perf_counter() - began,
    )
