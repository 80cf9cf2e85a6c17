"""Tiny GGUF files written the way llama.cpp's converter writes them, for the import's tests.

A random LLaMA-family model in Hugging Face layout is renamed to llama.cpp's tensor names, its q/k
projections permuted for llama.cpp's rotary layout (llama arch only, as convert_hf_to_gguf.py does),
each tensor stored in a chosen GGML type (K-quants, which the gguf package cannot quantize, as random
blocks with sane scales), with a tokenizer trained on a few sentences: byte-level BPE (``gpt2``) or
SentencePiece BPE with scores and byte tokens (``llama``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers.implementations import SentencePieceBPETokenizer

Q = gguf.GGMLQuantizationType
# Every type the issue names, and a few more; norms and biases stay F32 as llama.cpp keeps them.
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q6_K, Q.Q5_0, Q.Q5_K]
HIDDEN, FF, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2  # K-quants need rows of 256
CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "What is the capital of France? The capital of France is Paris.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 0123456789 and punctuation: (a), [b], {c}; 'quotes' \"too\"!",
    "Ünïcödé: naïve café, 日本語, emoji 🙂.",
] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_level_vocab() -> tuple[list[str], list[str]]:
    """Tokens (specials first) and merges of a byte-level BPE trained on the corpus."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return tokens, merges


def sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores, types of a SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, pieces."""
    trainer = SentencePieceBPETokenizer(add_prefix_space=True)
    trainer.train_from_iterator(CORPUS, vocab_size=300, special_tokens=[])
    pieces = [t for t, _ in sorted(trainer.get_vocab().items(), key=lambda item: item[1])]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def hf_weights(vocab: int, *, biases: bool, tied: bool, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    head_dim = HIDDEN // HEADS

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    weights = {"model.embed_tokens.weight": w(vocab, HIDDEN), "model.norm.weight": 1 + w(HIDDEN)}
    if not tied:
        weights["lm_head.weight"] = w(vocab, HIDDEN)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        weights |= {
            p + "input_layernorm.weight": 1 + w(HIDDEN), p + "post_attention_layernorm.weight": 1 + w(HIDDEN),
            p + "self_attn.q_proj.weight": w(HEADS * head_dim, HIDDEN),
            p + "self_attn.k_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.v_proj.weight": w(KV_HEADS * head_dim, HIDDEN),
            p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * head_dim),
            p + "mlp.gate_proj.weight": w(FF, HIDDEN), p + "mlp.up_proj.weight": w(FF, HIDDEN),
            p + "mlp.down_proj.weight": w(HIDDEN, FF),
        }
        if biases:
            weights |= {p + f"self_attn.{x}_proj.bias": w(n * head_dim)
                        for x, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS))}
    return weights


GGUF_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def stored(values: np.ndarray, qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """The tensor's bytes in ``qtype`` (random valid blocks for the K-quants the gguf package cannot make)."""
    if qtype == Q.F32:
        return values
    if qtype == Q.F16:
        return values.astype(np.float16)
    if qtype not in (Q.Q4_K, Q.Q6_K, Q.Q5_K):
        return gguf.quants.quantize(values, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (values.size // block, size), dtype=np.uint8)
    scale = np.full(len(blocks), 0.002, np.float16).view(np.uint8).reshape(-1, 2)
    if qtype == Q.Q6_K:  # ql, qh, int8 scales, then d
        blocks[:, -2:] = scale
    else:  # d, dmin first
        blocks[:, 0:2], blocks[:, 2:4] = scale, scale
    return blocks.reshape(values.shape[0], -1)


def write_tiny_gguf(
    path: Path, *, arch: str = "llama", name: str = "tiny", tokenizer: str = "gpt2", tied: bool = False,
    types: list[Q] = TYPES, seed: int = 0, rope_scaling: dict | None = None,
    extra_tensors: dict | None = None, skip_tensors: tuple[str, ...] = (), extra_ints: dict | None = None,
) -> Path:
    """Write a tiny model as llama.cpp would; returns ``path``."""
    rng = np.random.default_rng(seed + 1)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (extra_ints or {}).items():
        writer.add_uint16(key, value)
    writer.add_name(name)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if tokenizer == "gpt2":
        tokens, merges = byte_level_vocab()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "default")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        writer.add_token_merges(merges)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(False)
        writer.add_chat_template(CHAT_TEMPLATE)
    else:
        tokens, scores, token_types = sentencepiece_vocab()
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(token_types)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
    vocab = len(tokens)
    weights = hf_weights(vocab, biases=arch == "qwen2", tied=tied, seed=seed)
    matrices = 0
    for hf, values in weights.items():
        name_ = gguf_name(hf)
        if name_ in skip_tensors:
            continue
        if arch == "llama" and ("q_proj" in hf or "k_proj" in hf):
            values = permute(values, HEADS if "q_proj" in hf else KV_HEADS)
        qtype = Q.F32 if values.ndim == 1 else types[matrices % len(types)]
        matrices += values.ndim == 2
        writer.add_tensor(name_, stored(values, qtype, rng), raw_dtype=None if qtype == Q.F32 else qtype)
    if rope_scaling is not None:
        writer.add_tensor("rope_freqs.weight", llama3_rope_freqs(HIDDEN // HEADS, 10000.0, rope_scaling))
    for name_, values in (extra_tensors or {}).items():
        writer.add_tensor(name_, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def llama3_rope_freqs(head_dim: int, base: float, scaling: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors for rope_type llama3, as written there."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (1.0 / base ** (i / head_dim))
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
