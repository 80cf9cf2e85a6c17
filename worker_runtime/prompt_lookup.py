"""Prompt lookup: proposals for speculative decoding copied from the sequence itself.

A sequence's last few tokens often occurred before in its prompt or its output (a summary quoting its
source, an edit repeating the text, code naming its variables again, an answer citing a retrieved
passage); what followed them then is a good guess of what follows now. It costs no model and no
device: an index of the sequence's n-grams, grown as tokens arrive, finds the most recent earlier
occurrence of the longest suffix in O(1) per step.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAM_MAX = 3  # the longest suffix looked up: longer ones rarely match where a 3-gram does not
NGRAM_MIN = 1


class PromptLookup:
    """The n-gram index of one sequence (prompt and output); :meth:`propose` is its drafter."""

    def __init__(self, ngram_max: int = NGRAM_MAX, ngram_min: int = NGRAM_MIN):
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError("prompt lookup needs 1 <= ngram_min <= ngram_max")
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        # n-gram -> the position right after its most recent occurrence that has a continuation
        self._after: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
        ``tokens`` (``ngram_max`` down to ``ngram_min`` tokens); none where no suffix occurred before.
        ``tokens`` is the whole sequence so far, the same list grown from call to call."""
        length = len(tokens)
        for end in range(max(self._indexed, 1), length):  # every n-gram with a token after it
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self._after[tuple(tokens[end - n:end])] = end
        self._indexed = max(self._indexed, length)
        if k <= 0:
            return []
        for n in range(min(self.ngram_max, length), self.ngram_min - 1, -1):
            start = self._after.get(tuple(tokens[length - n:]))
            if start is not None:
                return list(tokens[start:start + k])
        return []
