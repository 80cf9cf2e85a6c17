"""Names of cached KV prefixes, torch-free: the head and the gateway's router compute the same ones.

A full block of ``block_size`` tokens is named by a 64-bit hash chained over every token before it
(``block_hashes``): two sequences share a block's name only if they share the whole prefix up to its
end, so a name found in a cache stands for that prefix's KV. The chain starts from a ``seed`` the
head derives from what else the KV depends on (``chain_seed``: the checkpoint, the pipeline and its
epoch; a re-formed pipeline starts from a new epoch and empty caches, so no name outlives the
placement it was computed under).

A head reports what it caches as a :class:`PrefixSummary`: a Bloom filter of its block names, a few
kilobytes whatever the cache holds, with the seed and block size the router needs to name a prompt's
blocks the same way. A false positive (about 2 % at the sizes chosen) only makes the router expect a
reuse the head then does not find: the request is prefilled in full, as without the summary.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

HASH_BYTES = 8
BLOOM_PROBES = 4
BLOOM_BITS_PER_BLOCK = 8  # ~2.4 % false positives with 4 probes at a full cache
MIN_BLOOM_BITS = 1 << 10
MAX_BLOOM_BITS = 1 << 18  # 32 KiB: past ~32k cached blocks the false-positive rate rises instead


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=HASH_BYTES).digest(), "little")


def chain_seed(*parts: object) -> int:
    """The start of a hash chain, from everything besides the tokens that the KV depends on."""
    return _digest("\x1f".join(map(str, parts)).encode())


def block_hashes(tokens: Sequence[int], block_size: int, seed: int, *, start: int = 0,
                 previous: int | None = None) -> list[int]:
    """The names of the full blocks of ``tokens``, from block ``start`` on (``previous``: the name of
    block ``start - 1``, required when ``start > 0``); a partial last block has no name."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if start and previous is None:
        raise ValueError("naming blocks from the middle of a chain needs the previous block's name")
    last = seed if not start else previous
    names = []
    pack = struct.Struct(f"<Q{block_size}q").pack
    for first in range(start * block_size, len(tokens) - block_size + 1, block_size):
        last = _digest(pack(last, *tokens[first:first + block_size]))
        names.append(last)
    return names


@dataclass(frozen=True)
class PrefixSummary:
    """A head's cached block names as a Bloom filter, with the seed and block size to name blocks by."""

    seed: int
    block_size: int
    bits: bytes

    @classmethod
    def of(cls, seed: int, block_size: int, names: Iterable[int], capacity_blocks: int) -> PrefixSummary:
        """The summary of ``names`` sized for a cache of ``capacity_blocks`` blocks."""
        size = min(MAX_BLOOM_BITS, max(MIN_BLOOM_BITS, BLOOM_BITS_PER_BLOCK * capacity_blocks))
        size = -(-size // 8) * 8
        bits = bytearray(size // 8)
        for name in names:
            for index in _probes(name, size):
                bits[index >> 3] |= 1 << (index & 7)
        return cls(seed, block_size, bytes(bits))

    def __contains__(self, name: int) -> bool:
        size = len(self.bits) * 8
        return bool(size) and all(self.bits[i >> 3] >> (i & 7) & 1 for i in _probes(name, size))

    def cached_tokens(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the head likely holds: whole blocks, up to the first
        block it does not hold, never the prompt's last token (the head computes at least that one)."""
        reusable = tokens[:max(0, len(tokens) - 1)]
        matched = 0
        for name in block_hashes(reusable, self.block_size, self.seed):
            if name not in self:
                break
            matched += 1
        return matched * self.block_size

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "block_size": self.block_size,
                "bloom": base64.b64encode(self.bits).decode("ascii")}

    @classmethod
    def from_json(cls, raw: Any) -> PrefixSummary:
        """Parse a head's summary; raises ``ValueError`` naming what is wrong."""
        try:
            seed, block_size, bloom = int(raw["seed"]), int(raw["block_size"]), str(raw["bloom"])
            bits = base64.b64decode(bloom, validate=True)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed prefix summary: {exc!r}") from exc
        if block_size <= 0 or not 0 <= seed < 1 << 64 or len(bits) * 8 > MAX_BLOOM_BITS:
            raise ValueError("malformed prefix summary: block_size, seed or filter size out of range")
        return cls(seed, block_size, bits)


def _probes(name: int, size: int) -> list[int]:
    """Bloom filter positions of a name: double hashing over its two 32-bit halves."""
    low, high = name & 0xFFFFFFFF, (name >> 32) | 1
    return [(low + i * high) % size for i in range(BLOOM_PROBES)]
