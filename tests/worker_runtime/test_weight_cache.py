"""Quantized layers read back from the node's weight cache instead of quantized again: the same tensors
and logits as a stage that quantized them, no quantization in a later load (a boundary move's two
stages included), and a miss, quantized afresh, when the checkpoint or the layout changed."""

from __future__ import annotations

import os

import pytest
import torch

from contracts.precision import Precision
from worker_runtime import Batch, Stage, quantize


def load(path, cache, start=0, end=4, bits=4, **kw) -> Stage:
    return Stage.load(path, start, end, precision=Precision(bits), kv_tokens=64, weight_cache=cache, **kw)


@pytest.fixture
def quantized(monkeypatch) -> list[str]:
    """The names of the quantizing functions called from now on."""
    calls: list[str] = []
    for name in ("quantize_int4_rows", "quantize_int8_rows"):
        real = getattr(quantize, name)
        monkeypatch.setattr(quantize, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


@pytest.mark.parametrize("bits", [4, 8])
def test_a_second_load_reads_every_quantized_layer_back_and_computes_the_same(checkpoints, tmp_path, bits,
                                                                              quantized):
    path, cache = checkpoints["llama_gqa_llama3"], tmp_path / "cache"
    first = load(path, cache, bits=bits)
    assert quantized and len(list(cache.glob("*.safetensors"))) == 5  # 4 layers and the lm_head
    quantized.clear()

    second = load(path, cache, bits=bits)
    assert quantized == []
    expected = first.state_dict()
    for key, tensor in second.state_dict().items():
        assert torch.equal(tensor, expected[key]), key
    batch = Batch.of_tokens([0], [[3, 5, 7, 11]], [0])
    assert torch.equal(second.forward(batch), first.forward(batch))


def test_a_boundary_move_reads_back_the_layers_either_stage_quantized(checkpoints, tmp_path, quantized):
    path, cache = checkpoints["llama_gqa_llama3"], tmp_path / "cache"
    load(path, cache, 0, 2)
    load(path, cache, 2, 4)
    quantized.clear()
    load(path, cache, 0, 1)  # the boundary moved by one layer: both new stages only read
    load(path, cache, 1, 4)
    assert quantized == []


def test_a_changed_checkpoint_or_layout_is_quantized_afresh(checkpoints, tmp_path, quantized):
    path, cache = checkpoints["llama_gqa_llama3"], tmp_path / "cache"
    load(path, cache)
    quantized.clear()
    load(path, cache, group_size=64)  # another group size (the default is 32): other tensors
    assert quantized
    quantized.clear()
    checkpoint = path / "model.safetensors"
    stat = checkpoint.stat()
    os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1000))  # the checkpoint was rewritten
    try:
        load(path, cache)
    finally:
        os.utime(checkpoint, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert quantized
