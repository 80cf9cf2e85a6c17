import json
from pathlib import Path

import pytest

from contracts.model_config import ModelConfig
from contracts.model_profile import ModelProfile
from contracts.profiler import profile_model

MODELS = Path(__file__).resolve().parents[2] / "examples" / "models"


def profile(name, **kw):
    return profile_model(ModelConfig.from_file(MODELS / name), name, **kw)


# Parameter counts of the published checkpoints (sum of the safetensors tensors' sizes).
@pytest.mark.parametrize(
    "name, params",
    [
        ("Llama-2-7B", 6_738_415_616),
        ("Llama-3-8B", 8_030_261_248),
        ("Mistral-7B-v0.1", 7_241_732_096),
        ("Qwen2.5-7B", 7_615_616_512),
        ("Llama-2-70B", 68_976_648_192),
        ("Qwen2.5-32B", 32_763_876_352),
    ],
)
def test_total_params_match_the_published_checkpoints(name, params):
    assert abs(profile(name).total_params - params) / params < 0.005


def test_llama2_7b_layer_figures():
    p = profile("Llama-2-7B")
    layer = p.layers[0]
    assert p.num_layers == len(p.layers) == 32
    assert layer.params == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    matmul = layer.params - 2 * 4096
    assert layer.flops_per_token == 2 * matmul
    assert layer.attention_flops_per_token_per_context == 4 * 32 * 128
    assert layer.kv_bytes_per_token == 2 * 32 * 128 * 2
    assert layer.weight_bytes[16] == 2 * layer.params
    # int8: a byte a weight, one fp16 scale per output row (q, k, v, o, down: 5 * 4096; gate, up: 2 * 11008).
    assert layer.weight_bytes[8] == matmul + 2 * (5 * 4096 + 2 * 11008) + 2 * 2 * 4096
    # int4: half a byte a weight, fp16 scale + zero per 32 inputs per row (the default group).
    groups = (4 * 4096 * 4096 + 2 * 4096 * 11008) // 32 + 11008 * 4096 // 32
    assert layer.weight_bytes[4] == matmul // 2 + 4 * groups + 2 * 2 * 4096
    assert p.activation_bytes_per_token == 4096 * 2
    assert p.embedding.flops_per_token == 0 and p.embedding.weight_bytes[4] == 32000 * 4096 * 2
    assert p.head.flops_per_token == 2 * 32000 * 4096 and p.head.params == 32000 * 4096 + 4096


def test_gqa_and_qwen_biases():
    llama3 = profile("Llama-3-8B").layers[0]
    assert llama3.kv_bytes_per_token == 2 * 8 * 128 * 2
    qwen = profile("Qwen2.5-7B").layers[0]
    hidden, kv = 3584, 4 * 128
    matmul = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * 18944
    assert qwen.params == matmul + (hidden + 2 * kv) + 2 * hidden  # q/k/v biases, no o_proj bias
    assert qwen.flops_per_token == 2 * matmul


def test_tied_embeddings_are_counted_once_but_held_twice():
    raw = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": True}
    p = profile_model(ModelConfig.from_dict(raw), "tiny")
    untied = profile_model(ModelConfig.from_dict({**raw, "tie_word_embeddings": False}), "tiny")
    assert p.head.weight_bytes == untied.head.weight_bytes  # the last stage keeps its own copy
    assert p.total_params == untied.total_params - 1000 * 64


def test_group_size_and_round_trip():
    coarse = profile("Llama-2-7B", group_size=128)  # fewer groups than the default 32: fewer bytes
    assert coarse.layers[0].weight_bytes[4] < profile("Llama-2-7B").layers[0].weight_bytes[4]
    assert coarse.extra["quantization"]["group_size"] == 128
    assert ModelProfile.from_dict(json.loads(json.dumps(coarse.to_dict()))) == coarse
    with pytest.raises(ValueError, match="group_size"):
        profile("Llama-2-7B", group_size=0)
