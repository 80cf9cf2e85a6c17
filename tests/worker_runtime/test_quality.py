"""Measured quality on a tiny model whose layer 2 is made fragile: it must come out the most sensitive."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from worker_runtime.quality import measure_quality


def fragile_checkpoint(out, fragile: int | None = 2):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=4, vocab_size=256, initializer_range=0.05, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    if fragile is not None:
        with torch.no_grad():  # heavy-tailed, larger outputs: a coarse grid for the many small weights
            for linear in (model.model.layers[fragile].mlp.down_proj,
                           model.model.layers[fragile].self_attn.o_proj):
                linear.weight.mul_(torch.exp(1.5 * torch.randn_like(linear.weight))).mul_(3.0)
    model.save_pretrained(out, safe_serialization=True)
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = fragile_checkpoint(tmp_path_factory.mktemp("fragile") / "llama")
    # Group 128: the planted layer is fragile at that grid (groups of 32 tame its outliers).
    return measure_quality(path, tokens=512, held_tokens=512, window=128, group_size=128)


def test_the_fragile_layer_is_the_most_sensitive(report):
    for bits in (8, 4):
        kl = report.layer_kl[bits]
        assert max(range(4), key=kl.__getitem__) == 2, kl
        assert all(k >= 0 for k in kl)
    # int4 costs more than int8 on every layer; perplexity with one low layer is measured for each.
    assert all(k4 > k8 for k4, k8 in zip(report.layer_kl[4], report.layer_kl[8]))
    assert all(math.isfinite(p) and p > 1 for p in report.layer_perplexity[4])


def test_whole_model_perplexities(report):
    ppl = report.perplexity
    assert set(ppl) == {"fp32", "bf16", "int8", "int4"}
    assert all(math.isfinite(p) and p > 1 for p in ppl.values())
    assert abs(ppl["bf16"] / ppl["fp32"] - 1) < abs(ppl["int4"] / ppl["fp32"] - 1)
    data = report.to_dict()
    assert set(data["layer_kl"]) == {"8", "4"} and len(data["layer_kl"]["4"]) == 4
    assert report.sensitivity()[4] == tuple(report.layer_kl[4])


def test_a_layer_at_full_precision_changes_nothing(tmp_path):
    """Control: without the outliers no layer stands out by an order of magnitude (the test can fail)."""
    path = fragile_checkpoint(tmp_path / "llama", fragile=None)
    plain = measure_quality(path, tokens=256, held_tokens=256, window=128, layers=[0, 2], group_size=128)
    assert plain.layer_kl[4][1] == 0.0 and plain.layer_kl[4][3] == 0.0  # not swept
    assert plain.layer_kl[4][2] < 10 * plain.layer_kl[4][0]
