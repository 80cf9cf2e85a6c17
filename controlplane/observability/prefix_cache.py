"""Prefix caching at scrape time, from the stages' statistics (contracts §4, ``prefix_*``).

Per replica, vLLM's names and meanings, from its head (stage 0), which looks every new sequence's
prompt up and decides what the pipeline reuses: ``vllm:prefix_cache_queries_total`` (prompt tokens
looked up) and ``vllm:prefix_cache_hits_total`` (tokens reused), counters since the head started (a
restarted head starts from 0, which Prometheus reads as a counter reset), and vLLM's older gauge
``vllm:gpu_prefix_cache_hit_rate``, hits over queries since then. Per stage, motley's own: the KV
blocks it keeps named for reuse, on the device and in host memory, and how many it evicted. A stage
that reports no ``prefix_*`` figure (caching off, or an engine without it) has none of these series.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controlplane.observability.fleet import as_number

REPLICA_LABELS = ("model_name", "replica")
# Each stage's cached blocks by where they are kept: stage statistic -> ``tier`` label.
BLOCK_TIERS = {"prefix_cached_blocks": "device", "prefix_host_blocks": "host"}


class PrefixCacheFamilies:
    """The prefix-caching families of one scrape, filled stage by stage (``add``)."""

    def __init__(self, stage_labels: tuple[str, ...]):
        self.queries = CounterMetricFamily(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens (the "
            "replica's head, since it started).", labels=REPLICA_LABELS)
        self.hits = CounterMetricFamily(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens (the replica's "
            "head, since it started).", labels=REPLICA_LABELS)
        self.hit_rate = GaugeMetricFamily(
            "vllm:gpu_prefix_cache_hit_rate", "Prefix cache hit rate: cached over queried prompt tokens "
            "since the replica's head started, 0..1.", labels=REPLICA_LABELS)
        self.blocks = GaugeMetricFamily(
            "motley_stage_prefix_cache_blocks", "KV blocks the stage keeps named for reuse, by tier: device "
            "(its KV cache) or host (memory of its node).", labels=[*stage_labels, "tier"])
        self.evicted = CounterMetricFamily(
            "motley_stage_prefix_cache_evicted_blocks", "Cached KV blocks the stage evicted from its device "
            "to make room, since it started.", labels=stage_labels)

    def add(self, labels: list[str], stats: dict, *, head: bool) -> None:
        """One stage's statistics; ``labels`` are its stage labels (model_name and replica among them,
        ``model_name`` first and ``replica`` third, as ``pipeline.STAGE_LABELS`` orders them)."""
        for field, tier in BLOCK_TIERS.items():
            if (blocks := as_number(stats.get(field))) is not None:
                self.blocks.add_metric([*labels, tier], blocks)
        if (evicted := as_number(stats.get("prefix_evicted_blocks"))) is not None:
            self.evicted.add_metric(labels, evicted)
        queried = as_number(stats.get("prefix_queried_tokens"))
        hit = as_number(stats.get("prefix_hit_tokens"))
        if not head or queried is None or hit is None:
            return
        replica = [labels[0], labels[2]]
        self.queries.add_metric(replica, queried)
        self.hits.add_metric(replica, hit)
        if queried > 0:  # nothing looked up yet: no rate to give
            self.hit_rate.add_metric(replica, hit / queried)

    def families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        return [self.queries, self.hits, self.hit_rate, self.blocks, self.evicted]
