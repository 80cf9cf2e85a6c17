"""The precision of each layer of a stage, from a plan's ``bits`` and optional ``low_bits`` / ``low_from``.

A plan's stage may run its last layers below the rest (one card spending part of the quality
budget). The worker, the spec check and the agent's memory budget all read the stage the same way
through :func:`layer_precisions`, and the planner's what-if check names a bad split with
:func:`split_problem`; it imports nothing heavy, so the agent and the planner use it without torch.
"""

from __future__ import annotations

PRECISIONS = (16, 8, 4)


def layer_precisions(start: int, end: int, bits: int, low_bits: int | None = None,
                     low_from: int | None = None) -> tuple[int, ...]:
    """Bits of each layer of [start, end): ``bits``, or ``low_bits`` from layer ``low_from`` on
    (the stage's lm_head, if it has one, runs at the last layer's).

    ValueError names the problem: a precision other than 16, 8 or 4, a split that is half given
    or not strictly inside the stage, or a "low" precision that is not below ``bits``.
    """
    for value in (bits, low_bits):
        if value is not None and value not in PRECISIONS:
            raise ValueError(f"bits must be 16, 8 or 4, got {value}")
    problem = split_problem(start, end, bits, low_bits, low_from)
    if problem:
        raise ValueError(problem)
    if low_bits is None:
        return (bits,) * (end - start)
    return (bits,) * (low_from - start) + (low_bits,) * (end - low_from)


def split_problem(start: int, end: int, bits: int, low_bits: int | None, low_from: int | None) -> str | None:
    """What is wrong with a stage's split into two precisions (None: nothing, or no split)."""
    if low_bits is None and low_from is None:
        return None
    if low_bits is None or low_from is None or not start < low_from < end or low_bits >= bits:
        return (f"low_bits={low_bits} from layer {low_from}: both are needed, below bits={bits}, "
                f"from a layer strictly inside the stage's [{start}, {end})")
    return None
