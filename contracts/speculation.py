"""Speculative decoding's arithmetic, one copy for the planner (controlplane/planning/speculation.py) and
the head (worker_runtime/speculation.py, draft_client.py).

With each of k proposals accepted with probability ``a``, independently, a verification step yields the
accepted prefix plus one token of its own, in expectation

    E(a, k) = 1 + a + a^2 + ... + a^k = (1 - a^(k+1)) / (1 - a)        (k + 1 at a = 1)

tokens per sequence.
"""

from __future__ import annotations

# The acceptance rate assumed per proposal before anything was verified: prompt lookup proposes only
# where an n-gram of the prompt or the output repeats, and is right about half the time on the
# workloads it is for (summarising, editing, code, retrieval answers).
PRIOR_ACCEPTANCE = 0.5


def expected_tokens(acceptance: float, proposals: int) -> float:
    """E(a, k) of the module doc: tokens a sequence gains per verification step."""
    if not 0.0 <= acceptance <= 1.0 or proposals < 0:
        raise ValueError(f"acceptance {acceptance!r} must be in [0, 1] and proposals {proposals!r} >= 0")
    if acceptance == 1.0:
        return float(proposals + 1)
    return (1.0 - acceptance ** (proposals + 1)) / (1.0 - acceptance)
