"""What speculative decoding is predicted to give a replica: a pure model the evaluation uses.

Each decode step of a speculating sequence carries k + 1 positions through the pipeline (its last
accepted token and k proposals) and yields E(a, k) tokens per sequence (``contracts.speculation``),
``a`` being the rate at which proposals are accepted. Its cost is the stage time model's
(``cost_model.py``) for (k + 1) x the micro-batch's tokens: the weights are read once, the FLOPs, the
KV traffic and the hops grow k + 1 times. Decode tokens/s with speculation are ``E / round(k + 1)``
against ``1 / round(1)`` per sequence; since the engine adapts k per sequence and drops it to 0 where
it does not pay, the prediction is the larger of the two.

The acceptance rate is the deployment's measured one where its heads reported figures (accepted over
proposed tokens), else the mode's prior (``contracts.speculation.PRIOR_ACCEPTANCE``).
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.speculation import PRIOR_ACCEPTANCE, expected_tokens


@dataclass(frozen=True)
class Speculation:
    """A deployment's speculation as the planner prices it: its mode, its ceiling of proposals per
    sequence and step, its measured acceptance rate (None: the mode's prior), and ``propose_s``, what a
    draft model takes to propose ``tokens`` tokens (0 for prompt lookup, which costs nothing), which
    every speculative round waits for before it starts."""

    mode: str = "off"
    tokens: int = 4
    measured_acceptance: float | None = None
    propose_s: float = 0.0

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @property
    def acceptance(self) -> float:
        if self.measured_acceptance is not None:
            return self.measured_acceptance
        return PRIOR_ACCEPTANCE

    @property
    def source(self) -> str:
        return "measured" if self.measured_acceptance is not None else "prior"


@dataclass(frozen=True)
class SpeculationFigures:
    """One replica's decode throughput with and without speculation."""

    speculation: Speculation
    tokens_per_step: float  # E(a, k) per sequence
    plain_round_s: float  # a decode round with one position per sequence
    speculative_round_s: float  # with k + 1 positions per sequence
    batch: int

    @property
    def plain_tokens_per_s(self) -> float:
        return self.batch / self.plain_round_s

    @property
    def speculative_tokens_per_s(self) -> float:
        return self.batch * self.tokens_per_step / self.speculative_round_s

    @property
    def pays(self) -> bool:
        return self.speculative_tokens_per_s > self.plain_tokens_per_s

    @property
    def tokens_per_s(self) -> float:
        """The prediction: the adaptive count takes speculation only where it pays."""
        return max(self.speculative_tokens_per_s, self.plain_tokens_per_s)

    @property
    def token_latency_s(self) -> float:
        """Time between two tokens of one sequence, on average."""
        return self.batch / self.tokens_per_s


def speculation_figures(speculation: Speculation, *, batch: int, plain_round_s: float,
                        speculative_round_s: float) -> SpeculationFigures:
    """The figures of a replica whose rounds take ``plain_round_s`` with one position per sequence and
    ``speculative_round_s`` with k + 1, the draft's proposing added to the latter."""
    return SpeculationFigures(speculation, expected_tokens(speculation.acceptance, speculation.tokens),
                              plain_round_s, speculative_round_s + speculation.propose_s, batch)
