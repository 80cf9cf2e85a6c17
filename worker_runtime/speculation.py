"""Speculative decoding at the head: how many proposals each sequence carries, and which are accepted.

A verification step feeds a decoding sequence its last token and ``k`` proposed ones; every stage runs
them in one pass (``Batch.logit_rows``) and the last samples the target's token after each position.
Proposal ``i`` is accepted when it equals the target's token before it, and the step emits the target's
tokens up to the first rejection and the one after it: between 1 and k + 1 tokens for one pass through
the pipeline. The target's token at each position is drawn as decoding without speculation draws it
(``sampling.sample``: per-request seed and position), so the output is the same token for token, greedy
or seeded; for a deterministic proposal this coupling is the standard rejection rule (accept with the
target's probability of the proposal, else draw from the target without it), so the output
distribution is the target model's.

How many proposals pay depends on the pipeline and the load, so it is measured, not configured
(:class:`StepCost`): extra positions cost almost nothing where a step is latency-bound (hops between
hosts, a memory-bound old card at batch 1) and their full compute where it is not (a large batch).
Each sequence keeps its own acceptance rate; :class:`SpeculationPolicy` adds proposals while the
expected tokens they bring outweigh what they slow every sequence of the micro-batch, and proposes
nothing where they do not, so speculation never makes a workload slower than decoding without it.

Where the proposals come from is a :class:`Drafter`: :class:`LookupDrafter` (n-grams of the sequence
itself, prompt_lookup.py) or a draft model served as its own pipeline (draft_client.py); the policy,
the verification's outcome and the figures are the same for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from contracts.speculation import PRIOR_ACCEPTANCE

from .prompt_lookup import PromptLookup
from .scheduler import Request, Scheduler

ACCEPTANCE_MEMORY = 0.7  # weight of a sequence's past in its acceptance counts, per verification
OVERALL_MEMORY = 0.9  # the same for the counts of every sequence together
COST_MEMORY = 0.98  # weight of the past in the step-cost fit: about the last 50 micro-batches
PRIOR_TOKEN_COST = 0.05  # a token's share of a step's fixed cost until the fit can tell it
FIT_SAMPLES = 8.0  # micro-batches (weighted) before the fit is trusted over the prior
FIXED_SHARE = 0.25  # the least share of a decode round trip the fit leaves fixed


def accepted_count(proposals: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading proposals the target's tokens confirm: ``targets[i]`` is the target's token
    after the position of ``proposals[i - 1]`` (``targets[0]`` follows the sequence's last token)."""
    count = 0
    for proposal, target in zip(proposals, targets):
        if proposal != target:
            break
        count += 1
    return count


class StepCost:
    """A micro-batch's round trip through the pipeline against its tokens, ``fixed + per_token x
    tokens``, fitted by least squares with exponential forgetting, so it follows the load."""

    def __init__(self, memory: float = COST_MEMORY):
        self.memory = memory
        self._sums = [0.0] * 5  # weight, x, y, xx, xy

    def observe(self, tokens: int, seconds: float) -> None:
        self._sums = [s * self.memory for s in self._sums]
        for i, value in enumerate((1.0, tokens, seconds, tokens * tokens, tokens * seconds)):
            self._sums[i] += value

    def fit(self) -> tuple[float, float]:
        """``(fixed, per_token)`` seconds; ``per_token`` falls back to ``PRIOR_TOKEN_COST`` of the fixed
        part while few micro-batches were seen or all had about the same tokens (nothing to fit it on).

        At least ``FIXED_SHARE`` of the mean round trip stays fixed: noise on a few points can tilt
        the line until nothing is fixed, which would rule out every proposal, and with no proposal
        the points would never spread again to correct it. (A decode round trip always has a fixed
        part: the weights read once, the hops, the loop.)"""
        weight, x, y, xx, xy = self._sums
        if weight <= 0:
            return 1.0, PRIOR_TOKEN_COST
        mean_x, mean_y = x / weight, y / weight
        spread = weight * xx - x * x
        if weight < FIT_SAMPLES or spread <= weight * weight * 0.25:  # tokens vary by under half a token
            return mean_y, PRIOR_TOKEN_COST * mean_y
        per_token = min(max(0.0, (weight * xy - x * y) / spread), (1 - FIXED_SHARE) * mean_y / mean_x)
        return mean_y - per_token * mean_x, per_token


@dataclass
class Candidate:
    """A decoding sequence of the micro-batch being formed: its proposals (at most what may be verified
    for it) and its acceptance rate."""

    proposals: list[int]
    acceptance: float
    chosen: int = 0  # how many of the proposals it carries


class SpeculationPolicy:
    """The head's proposal counts: per-sequence acceptance rates and the measured step cost."""

    def __init__(self) -> None:
        self.cost = StepCost()
        self._acceptance: dict[int, tuple[float, float]] = {}  # seq_id -> (accepted, tested), fading
        # Every sequence's outcomes as the same fading counts: a new sequence's rate until it verified
        # something, so a workload whose proposals fail (a draft model that guesses badly) stops paying
        # for them within a few verifications, not a few per request.
        self._overall = (PRIOR_ACCEPTANCE, 1.0)

    @property
    def overall(self) -> float:
        return self._overall[0] / self._overall[1]

    def acceptance(self, seq_id: int) -> float:
        counts = self._acceptance.get(seq_id)
        return counts[0] / counts[1] if counts else self.overall

    def verified(self, seq_id: int, proposed: int, accepted: int) -> None:
        """Fold one verification's outcome into the sequence's rate: the chance that a proposal is
        accepted given that those before it were, which :meth:`choose` raises to a power, estimated as
        accepted over tested proposals (each count fading by ``ACCEPTANCE_MEMORY`` a verification; a
        new sequence starts from one proposal at the overall rate). The proposals after the first
        rejection were never tested, so they count neither way: counting them as rejections would
        take 4 proposals at 70 % for 44 %, and stop proposing where it pays."""
        if proposed:
            tested = accepted + (accepted < proposed)
            kept, tried = self._acceptance.get(seq_id, (self.overall, 1.0))
            self._acceptance[seq_id] = (ACCEPTANCE_MEMORY * kept + accepted,
                                        ACCEPTANCE_MEMORY * tried + tested)
            kept, tried = self._overall
            self._overall = (OVERALL_MEMORY * kept + accepted, OVERALL_MEMORY * tried + tested)

    def forget(self, seq_id: int) -> None:
        self._acceptance.pop(seq_id, None)

    def pays(self, gain: float, expected: float, tokens: int) -> bool:
        """Whether one more token in a micro-batch of ``tokens`` tokens that emits ``expected`` tokens
        raises its tokens per second, where it adds ``gain`` expected tokens:
        ``(expected + gain) / (time + per_token) > expected / time``."""
        fixed, per_token = self.cost.fit()
        return gain * (fixed + per_token * tokens) > per_token * expected

    def choose(self, candidates: list[Candidate], sequences: int, tokens: int, token_room: int) -> None:
        """Set each candidate's ``chosen``: add the proposal of the highest expected gain (the chance that
        it and every proposal before it are accepted) while that gain outweighs what one more token
        costs every sequence of the micro-batch (``sequences`` of them, ``tokens`` tokens without
        proposals), and while the micro-batch has ``token_room`` tokens left."""
        expected = float(sequences)  # tokens the micro-batch emits: one per sequence, plus the accepted
        while token_room > 0:
            best, gain = None, 0.0
            for candidate in candidates:
                if candidate.chosen < len(candidate.proposals):
                    chance = candidate.acceptance ** (candidate.chosen + 1)
                    if chance > gain:
                        best, gain = candidate, chance
            if best is None or not self.pays(gain, expected, tokens):
                return
            best.chosen += 1
            expected += gain
            tokens += 1
            token_room -= 1


def proposal_room(request: Request, ceiling: int) -> int:
    """How many proposals a request's next step may carry: none before its first token or where it opted
    out, never more than it may still emit less one (its KV was reserved for its whole length, no more)."""
    if not request.output or not request.speculate:
        return 0
    return max(0, min(ceiling, request.max_tokens - len(request.output) - 1))


class Drafter(Protocol):
    """Where proposals come from. ``prepare`` runs before the head forms micro-batches (a drafter that
    must wait for its proposals holds the requests it drafts for: ``Scheduler.hold``); ``propose`` gives
    up to ``room`` proposals for a request of a micro-batch about to start."""

    def prepare(self, scheduler: Scheduler, policy: SpeculationPolicy, ceiling: int) -> None: ...

    def propose(self, request: Request, room: int) -> list[int]: ...

    def forget(self, seq_id: int) -> None: ...

    def close(self) -> None: ...


class LookupDrafter:
    """Prompt lookup: each sequence's n-gram index (prompt_lookup.py), ready at once."""

    def __init__(self) -> None:
        self._lookups: dict[int, PromptLookup] = {}

    def prepare(self, scheduler: Scheduler, policy: SpeculationPolicy, ceiling: int) -> None:
        pass

    def propose(self, request: Request, room: int) -> list[int]:
        lookup = self._lookups.setdefault(request.seq_id, PromptLookup())
        return lookup.propose(request.prompt + request.output, room)

    def forget(self, seq_id: int) -> None:
        self._lookups.pop(seq_id, None)

    def close(self) -> None:
        pass


class Speculator:
    """The head's speculative decoding: proposals from its drafter, counted by the policy, set on the
    requests of a micro-batch before it starts (:meth:`propose`), and settled when its tokens return
    (:meth:`settle`); with the figures the head reports (``spec_*``, vLLM's spec-decode counters)."""

    def __init__(self, ceiling: int, drafter: Drafter | None = None):
        self.ceiling = ceiling
        self.policy = SpeculationPolicy()
        self.drafter = drafter or LookupDrafter()
        # seq_id -> the first proposal the policy did not send: checked against the token the step emits
        # (free), so a sequence whose rate fell below what pays still learns when its text turns to copying
        self._unsent: dict[int, int] = {}
        self.drafts = 0  # sequence-steps that carried proposals
        self.draft_tokens = 0
        self.accepted_tokens = 0

    def prepare(self, scheduler: Scheduler) -> None:
        """The drafter's turn before micro-batches form (see :class:`Drafter`)."""
        self.drafter.prepare(scheduler, self.policy, self.ceiling)

    def propose(self, requests: Sequence[Request], max_batch_tokens: int) -> None:
        """Give each decoding request of a micro-batch about to start the proposals that pay
        (at most :func:`proposal_room`)."""
        tokens = sum(len(r.next_input()[0]) for r in requests)
        rooms = {r.seq_id: room for r in requests if (room := proposal_room(r, self.ceiling)) > 0}
        eligible = [r for r in requests if r.seq_id in rooms]
        # A large batch, where even a sure proposal would not pay: no drafting at all. Below that the
        # drafter's proposals are asked for even where the sequence's rate rules them out, so that an
        # unsent one can still be checked (``_unsent``).
        if not eligible or not self.policy.pays(1.0, len(requests), tokens):
            return
        candidates, chosen_for = [], []
        for request in eligible:
            room = rooms[request.seq_id]
            proposals = self.drafter.propose(request, room)[:room]
            if proposals:
                candidates.append(Candidate(proposals, self.policy.acceptance(request.seq_id)))
                chosen_for.append(request)
        if candidates:
            self.policy.choose(candidates, len(requests), tokens, max_batch_tokens - tokens)
        for request, candidate in zip(chosen_for, candidates):
            request.proposals = candidate.proposals[:candidate.chosen]
            if not candidate.chosen:
                self._unsent[request.seq_id] = candidate.proposals[0]

    def settle(self, requests: Sequence[Request], seq_ids: Sequence[int], tokens: Sequence,
               round_trip: tuple[int, float] | None) -> list:
        """The tokens each sequence of a returned micro-batch emits: for a verified one (a list of the
        target's tokens), those up to its first rejected proposal and the target's token there.
        ``round_trip``: the micro-batch's tokens and seconds, for the step-cost fit (decode steps
        only: a prefill's cost per token is its compute's, which a decode step's extra positions
        rarely pay)."""
        by_seq = {r.seq_id: r for r in requests}
        settled = []
        for seq_id, entry in zip(seq_ids, tokens):
            request = by_seq.get(seq_id)
            unsent = self._unsent.pop(seq_id, None)
            if request is not None and unsent is not None:
                target = entry[0] if isinstance(entry, list) else entry
                self.policy.verified(seq_id, 1, int(target == unsent))
            if request is None or not isinstance(entry, list):
                settled.append(entry)
                continue
            proposals, request.proposals = request.proposals, []
            accepted = accepted_count(proposals, entry)
            self.policy.verified(seq_id, len(proposals), accepted)
            self.drafts += 1
            self.draft_tokens += len(proposals)
            self.accepted_tokens += accepted
            settled.append(entry[:accepted + 1])
        if round_trip is not None:
            self.policy.cost.observe(*round_trip)
        return settled

    def forget(self, seq_id: int) -> None:
        self.drafter.forget(seq_id)
        self._unsent.pop(seq_id, None)
        self.policy.forget(seq_id)

    def close(self) -> None:
        self.drafter.close()

    def figures(self) -> dict[str, int]:
        return {"spec_drafts": self.drafts, "spec_draft_tokens": self.draft_tokens,
                "spec_accepted_tokens": self.accepted_tokens}
