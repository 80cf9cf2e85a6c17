"""Write a deterministic Hugging Face-format LLaMA checkpoint for demos and benchmarks, offline.

``python -m worker_runtime.make_demo_model OUT [--layers N --hidden H ...]`` writes config.json,
model.safetensors, tokenizer.json and tokenizer_config.json (with a chat template). The weights are
random but seeded per tensor, and the tokenizer is a byte-level BPE trained on a built-in text, so the
same arguments always give the same bytes; transformers loads the result as ``LlamaForCausalLM`` and
``AutoTokenizer``. The default is about 100M parameters: big enough that decode is memory-bound.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}<|user|>{% else %}<|assistant|>{% endif %}"
    "{{ message['content'] }}{% if message['role'] != 'user' %}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = """\
Motley serves one language model across a mixed fleet of graphics cards. New cards have fast memory
and wide links; older cards have less memory and slower links, and several machines are joined by a
network. The planner splits the layers of the model into contiguous stages, picks a precision for
each stage, sizes each key and value cache, and predicts the time of every stage so that the slowest
one is known. Quantization to eight or four bits lets a small old card carry its share of the layers.
Requests arrive through an interface compatible with common clients; a router sends each request to
the replica with the most free capacity. Operators watch utilization, memory, temperature, power and
throughput on a dashboard, move layers between cards, and check the effect before they apply it.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly
quick daft zebras jump! Sphinx of black quartz, judge my vow. 0123456789 + - * / = ( ) [ ] { } < >
"""


def build_tokenizer(vocab_multiple: int = 64) -> Tokenizer:
    """A byte-level BPE, its vocabulary padded with reserved tokens to a multiple of ``vocab_multiple``."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    size = tokenizer.get_vocab_size()
    padding = -size % vocab_multiple
    tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(padding)])
    return tokenizer


def demo_config(args: argparse.Namespace, vocab_size: int, tokenizer: Tokenizer) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": args.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": args.dtype,
        "bos_token_id": tokenizer.token_to_id(SPECIAL_TOKENS[0]),
        "eos_token_id": tokenizer.token_to_id(SPECIAL_TOKENS[1]),
        "initializer_range": args.std,
    }


def _tensor(name: str, shape: tuple[int, ...], std: float, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Seeded by (seed, name), so each tensor is reproducible on its own, whatever the write order."""
    generator = torch.Generator().manual_seed(seed * 2**32 + zlib.crc32(name.encode()))
    return (torch.randn(shape, generator=generator) * std).to(dtype)


def demo_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Hugging Face tensor name -> shape for a demo config (norms included)."""
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    shapes: dict[str, tuple[int, ...]] = {
        "model.norm.weight": (h,),
        "model.embed_tokens.weight": (config["vocab_size"], h),
        "lm_head.weight": (config["vocab_size"], h),
    }
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes


def demo_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded normal matrices and unit norm weights, as a freshly initialized LLaMA has."""
    dtype = getattr(torch, config["torch_dtype"])
    std = config["initializer_range"]
    return {
        name: torch.ones(shape, dtype=dtype) if len(shape) == 1 else _tensor(name, shape, std, seed, dtype)
        for name, shape in demo_shapes(config).items()
    }


def write_demo_model(args: argparse.Namespace) -> int:
    """Write the checkpoint into ``args.out``; returns its number of parameters."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    config = demo_config(args, tokenizer.get_vocab_size(), tokenizer)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = demo_weights(config, args.seed)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": SPECIAL_TOKENS[0],
        "eos_token": SPECIAL_TOKENS[1],
        "pad_token": SPECIAL_TOKENS[1],
        "model_max_length": args.max_positions,
        "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")
    return sum(t.numel() for t in weights.values())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="directory to write the checkpoint into")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--max-positions", type=int, default=2048)
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--std", type=float, default=0.02, help="standard deviation of the random weights")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    n_params = write_demo_model(args)
    print(f"wrote {args.out}: {n_params / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
