"""The precision of a stage's layers: a plan's ``bits`` and optional ``low_bits`` / ``low_from``.

A plan's stage may run its last layers below the rest (one card spending part of the quality
budget). :class:`Precision` is that triple as one value: the stage spec, the footprint, the planner
and the worker's stage loader all carry it, read a stage's layers through
:meth:`Precision.layer_bits` and name a bad split with :meth:`Precision.problem`. It serializes to
the same flat fields the spec file and the plan JSON have always had (:meth:`Precision.fields`,
:meth:`Precision.of`). It imports nothing heavy, so the agent and the planner use it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

PRECISIONS = (16, 8, 4)


@dataclass(frozen=True)
class Precision:
    """``bits`` for every layer of a stage, or, with ``low_bits`` and ``low_from``, ``low_bits`` for
    layers [low_from, end) and the stage's lm_head (if it has one)."""

    bits: int = 16
    low_bits: int | None = None
    low_from: int | None = None

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> "Precision":
        """The precision named by the flat ``bits`` (default 16), ``low_bits`` and ``low_from`` fields
        of a stage spec or a plan's stage (ValueError / TypeError on a value that is not a number)."""
        low_bits, low_from = fields.get("low_bits"), fields.get("low_from")
        return cls(int(fields.get("bits", 16)), None if low_bits is None else int(low_bits),
                   None if low_from is None else int(low_from))

    @property
    def is_split(self) -> bool:
        """Whether the stage's last layers run at ``low_bits``."""
        return self.low_bits is not None

    def fields(self) -> dict[str, int | None]:
        """``bits``, ``low_bits`` and ``low_from``, as a stage spec writes them (None where not split)."""
        return {"bits": self.bits, "low_bits": self.low_bits, "low_from": self.low_from}

    def split_fields(self) -> dict[str, int]:
        """``low_bits`` and ``low_from``, only for a split stage (a plan's stage omits them otherwise)."""
        return {} if self.low_bits is None else {"low_bits": self.low_bits, "low_from": self.low_from}

    def layer_bits(self, start: int, end: int) -> tuple[int, ...]:
        """Bits of each layer of [start, end) (the stage's lm_head, if it has one, runs at the last one's).

        ValueError names the problem: a precision other than 16, 8 or 4, a split that is half given
        or not strictly inside the stage, or a "low" precision that is not below ``bits``.
        """
        for value in (self.bits, self.low_bits):
            if value is not None and value not in PRECISIONS:
                raise ValueError(f"bits must be 16, 8 or 4, got {value}")
        problem = self.problem(start, end)
        if problem:
            raise ValueError(problem)
        if self.low_bits is None:
            return (self.bits,) * (end - start)
        return (self.bits,) * (self.low_from - start) + (self.low_bits,) * (end - self.low_from)

    def problem(self, start: int, end: int) -> str | None:
        """What is wrong with the split into two precisions of a stage [start, end) (None: nothing, or
        no split)."""
        low_bits, low_from = self.low_bits, self.low_from
        if low_bits is None and low_from is None:
            return None
        if low_bits is None or low_from is None or not start < low_from < end or low_bits >= self.bits:
            return (f"low_bits={low_bits} from layer {low_from}: both are needed, below bits={self.bits}, "
                    f"from a layer strictly inside the stage's [{start}, {end})")
        return None


FULL = Precision()  # every layer at 16 bits
