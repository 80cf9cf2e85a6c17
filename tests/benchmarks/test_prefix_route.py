"""prefix_route reads the hit rate of a window from the heads' vLLM counters, summed over the replicas,
and sets the prefix-aware router beside the blind one and one replica alone."""

from __future__ import annotations

import pytest

from benchmarks.prefix_route import counters_of, route_table

METRICS = """# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="SmolLM2-135M-Instruct",replica="d1-r0"} 700.0
vllm:prefix_cache_queries_total{model_name="SmolLM2-135M-Instruct",replica="d1-r1"} 300.0
vllm:prefix_cache_hits_total{model_name="SmolLM2-135M-Instruct",replica="d1-r0"} 640.0
vllm:prefix_cache_hits_total{model_name="SmolLM2-135M-Instruct",replica="d1-r1"} 0.0
vllm:gpu_prefix_cache_hit_rate{model_name="SmolLM2-135M-Instruct",replica="d1-r0"} 0.91
vllm:prompt_tokens_total{model_name="SmolLM2-135M-Instruct",replica="d1-r0"} 700.0
"""


def test_the_counters_are_summed_over_the_replicas_and_nothing_else_counts():
    assert counters_of(METRICS) == {"hits": 640.0, "queries": 1000.0}
    assert counters_of("") == {"hits": 0.0, "queries": 0.0}


def window(p99: float, hit_rate: float) -> dict:
    return {"turns": 40, "failed": 0, "rate": 0.5, "median": p99 / 2, "p99": p99, "hit_rate": hit_rate}


def test_the_table_gives_the_two_goals_ratios(capsys):
    ratios = route_table(window(4.0, 0.9), window(5.0, 0.6), window(2.5, 0.81))
    assert ratios == pytest.approx({"p99_ratio": 0.5, "hit_share": 0.9})
    out = capsys.readouterr().out
    assert "| `cost_aware` | 2 | 40 | 0 | 0.50 | 1.25 | 2.50 | 81.0% |" in out
