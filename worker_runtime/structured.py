"""Structured outputs where sampling happens (the last stage): a grammar's mask on a constrained row's
logits before sampling, the sampled token fed to the row's matcher after.

A sequence is constrained from its prefill, whose sampling parameters carry the
:class:`~contracts.structured.StructuredConstraint` (the head sends it with the prefill only:
``Request.step_params``). Its matcher (llguidance's ``LLMatcher``) lives here until the sequence is
freed, with its KV space; a ``reset`` drops them all. A resumed request's last ``generated`` prompt
tokens (``Batch.replay``) are fed to the new matcher first, so it goes on from where the output was.
Once the grammar is complete the mask allows only the checkpoint's end tokens, which the gateway stops
on (contracts/end_tokens.py). Only constrained rows pay for a mask; the others are untouched.

The tokenizer the matchers need (the vocabulary as bytes) is read lazily, at the first constrained
sequence, from the stage's checkpoint directory (``tokenizer.json``, which a GGUF import writes too);
nothing is fetched. Compiled grammars are kept per constraint, least recently used dropped first: a
new sequence of a known constraint copies its compiled matcher instead of compiling again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path

import llguidance
import torch
from tokenizers import Tokenizer

from contracts.end_tokens import checkpoint_end_tokens
from contracts.sampling import SamplingParams
from contracts.structured import StructuredConstraint

log = logging.getLogger(__name__)
COMPILED_GRAMMARS = 64  # per stage: compiled matchers kept for constraints seen recently
_SHIFTS = torch.arange(32, dtype=torch.int32)


def load_tokenizer(model_path: str | Path, vocab_size: int) -> llguidance.LLTokenizer:
    """The checkpoint's tokenizer as llguidance reads it, over the model's whole vocabulary (the ids
    past the tokenizer's are never allowed), ending with the checkpoint's end tokens."""
    path = Path(model_path) / "tokenizer.json"
    text = path.read_text()
    ends = checkpoint_end_tokens(model_path, Tokenizer.from_str(text).token_to_id)
    return llguidance.LLTokenizer(text, n_vocab=vocab_size, eos_token=list(ends) or None)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's bitmasks [rows, words] (int32, bit ``t % 32`` of word ``t // 32`` for token ``t``)
    as booleans [rows, vocab_size]."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


class Grammars:
    """The matchers of the constrained sequences of one stage's sampler, by sequence id."""

    def __init__(self, model_path: str | Path, vocab_size: int):
        self.model_path, self.vocab_size = model_path, vocab_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self.matchers: dict[int, llguidance.LLMatcher] = {}

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_path, self.vocab_size)
        return self._tokenizer

    def compiled(self, constraint: StructuredConstraint) -> llguidance.LLMatcher:
        """A fresh matcher of ``constraint``: a copy of its compiled one (compiled now if not kept)."""
        key = (constraint.kind, constraint.spec)
        matcher = self._compiled.get(key)
        if matcher is None:
            matcher = llguidance.LLMatcher(self.tokenizer, constraint.grammar(), log_level=0)
            self._compiled[key] = matcher
            if len(self._compiled) > COMPILED_GRAMMARS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        return matcher.deep_copy()

    def start(self, seq_id: int, constraint: StructuredConstraint, replay: list[int]) -> None:
        """The matcher of a sequence in its prefill, having matched ``replay`` (a resumed output)."""
        matcher = self.compiled(constraint)
        if replay and not matcher.consume_tokens(replay):
            log.warning("sequence %d: its output so far does not match its grammar: %s", seq_id,
                        matcher.get_error())
        self.matchers[seq_id] = matcher

    def constrain(self, logits: torch.Tensor, seq_ids: list[int], params: list[SamplingParams],
                  sampled: list[int], replay: dict[int, list[int]] | None
                  ) -> tuple[torch.Tensor, list[tuple[int, int]]]:
        """``logits`` [rows, vocab] with the constrained rows masked (``sampled``: the rows of each
        sequence, in order), and ``(seq_id, row)`` of each; starts the matchers of the sequences whose
        prefill this is. Raises ``ValueError`` for a constrained sequence that samples more than one
        row (a constrained request is never speculated)."""
        rows, at = [], 0
        for seq_id, p, n in zip(seq_ids, params, sampled):
            if p.constraint is not None and seq_id not in self.matchers:
                self.start(seq_id, p.constraint, (replay or {}).get(seq_id, []))
            if seq_id in self.matchers:
                if n != 1:
                    raise ValueError(f"sequence {seq_id} is constrained and samples {n} rows, not 1")
                rows.append((seq_id, at))
            at += n
        if rows:
            words = (self.vocab_size + 31) // 32
            bitmask = torch.zeros((len(rows), words), dtype=torch.int32)
            for i, (seq_id, _) in enumerate(rows):
                self._fill(seq_id, bitmask[i])
            refused = ~allowed_tokens(bitmask, logits.shape[-1]).to(logits.device)
            with torch.inference_mode():  # the logits are the forward's: masked in place, rows as views
                for i, (_, row) in enumerate(rows):
                    logits[row].masked_fill_(refused[i], float("-inf"))
        return logits, rows

    def _fill(self, seq_id: int, mask: torch.Tensor) -> None:
        """The next token's mask of a sequence; a matcher in error (a grammar past llguidance's limits)
        allows only the end tokens, so the sequence ends rather than leave its grammar."""
        matcher = self.matchers[seq_id]
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)
        if matcher.is_error():
            log.warning("sequence %d: its grammar failed: %s; it ends here", seq_id, matcher.get_error())
            mask.zero_()
            for token in self.tokenizer.eos_tokens:
                bit = 1 << (token % 32)
                mask[token // 32] |= bit - (1 << 32) if bit >= 1 << 31 else bit  # int32's sign bit

    def advance(self, rows: list[tuple[int, int]], tokens: torch.Tensor) -> None:
        """Feed each constrained sequence's sampled token to its matcher."""
        for seq_id, row in rows:
            self.matchers[seq_id].consume_token(int(tokens[row]))

    def free(self, seq_id: int) -> None:
        self.matchers.pop(seq_id, None)

    def clear(self) -> None:
        self.matchers.clear()
