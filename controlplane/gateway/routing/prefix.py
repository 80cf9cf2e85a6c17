"""How much of a prompt a replica's head already holds, from the summary the head reports.

The router asks every candidate replica, several times per decision (admission, the strategy, the
booking), so a prompt's block names are computed once per chain (seed, block size) and kept with the
request: each head chains from its own seed (``contracts.prefix_cache.chain_seed``), so replicas
that share nothing cost one hashing pass each. How far a summary holds the prompt is kept too (a
summary is immutable; a replica gets a new one at each poll), so each summary is probed once per
block however often it is asked; blocks named in ``also`` (sent since the summary) are looked up
past where the summary stops.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from contracts.prefix_cache import PrefixSummary, block_hashes


class PromptPrefix:
    """A prompt's token ids, with its block names per chain once asked for."""

    __slots__ = ("_held", "_names", "_tokens")

    def __init__(self, token_ids: Sequence[int]) -> None:
        self._tokens = token_ids
        self._names: dict[tuple[int, int], list[int]] = {}
        self._held: dict[int, tuple[PrefixSummary, int]] = {}  # id(summary) -> (it, blocks it holds)

    def names(self, seed: int, block_size: int) -> list[int]:
        """The names of the prompt's full blocks, its last token left out (the head computes it)."""
        key = (seed, block_size)
        if (names := self._names.get(key)) is None:
            reusable = self._tokens[:max(0, len(self._tokens) - 1)]
            names = self._names[key] = block_hashes(reusable, block_size, seed)
        return names

    def cached_tokens(self, summary: PrefixSummary, also: Container[int] = ()) -> int:
        """``summary.cached_tokens(token_ids)``: whole blocks up to the first the head lacks, the
        prompt's last token never among them; a block named in ``also`` counts as held too."""
        names = self.names(summary.seed, summary.block_size)
        known = self._held.get(id(summary))
        if known is None or known[0] is not summary:
            held = next((i for i, name in enumerate(names) if name not in summary), len(names))
            self._held[id(summary)] = known = (summary, held)
        held = known[1]
        while held < len(names) and (names[held] in also or names[held] in summary):
            held += 1
        return held * summary.block_size
