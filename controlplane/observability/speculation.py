"""Speculative decoding at scrape time, from the head's statistics (contracts §4, ``spec_*``).

Per replica, vLLM's names and meanings, from its head (stage 0), which proposes the tokens and
accepts them: ``vllm:spec_decode_num_drafts_total`` (sequence-steps that carried proposals),
``vllm:spec_decode_num_draft_tokens_total`` (tokens proposed) and
``vllm:spec_decode_num_accepted_tokens_total`` (proposals accepted), counters since the head started
(a restarted head starts from 0, which Prometheus reads as a counter reset). The acceptance rate is
accepted over draft tokens, the tokens per step (accepted + drafts) over drafts, both as rates of
these counters in PromQL. A head that reports no ``spec_*`` figure (speculation off, or an engine
without it) has none of these series.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily

from controlplane.observability.fleet import as_number
from controlplane.observability.prefix_cache import REPLICA_LABELS

# The head's statistic -> (family name without ``_total``, help).
SPEC_FAMILIES = {
    "spec_drafts": ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts: sequence-steps that "
                    "carried proposed tokens (the replica's head, since it started)."),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens proposed (the "
                          "replica's head, since it started)."),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens", "Number of draft tokens accepted "
                             "(the replica's head, since it started)."),
}


class SpecDecodeFamilies:
    """The speculative-decoding families of one scrape, filled stage by stage (``add``)."""

    def __init__(self) -> None:
        self.counters = {field: CounterMetricFamily(name, doc, labels=REPLICA_LABELS)
                         for field, (name, doc) in SPEC_FAMILIES.items()}

    def add(self, labels: list[str], stats: dict, *, head: bool) -> None:
        """One stage's statistics; ``labels`` are its stage labels (``model_name`` first and ``replica``
        third, as ``pipeline.STAGE_LABELS`` orders them). Only the head's count."""
        if not head:
            return
        for field, family in self.counters.items():
            if (value := as_number(stats.get(field))) is not None:
                family.add_metric([labels[0], labels[2]], value)

    def families(self) -> list[CounterMetricFamily]:
        return list(self.counters.values())
