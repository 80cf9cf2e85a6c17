"""The demo checkpoint is deterministic, ~100M parameters by default, and transformers loads it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from worker_runtime import Stage, generate
from worker_runtime.make_demo_model import build_tokenizer, demo_config, demo_shapes, parse_args

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--layers", "2", "--hidden", "128", "--heads", "4", "--kv-heads", "2", "--intermediate", "256"]


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def make(out: Path) -> Path:
    command = [sys.executable, "-m", "worker_runtime.make_demo_model", str(out), *SMALL]
    subprocess.run(command, cwd=REPO, check=True)
    return out


def test_default_size_is_about_100m_parameters():
    config = demo_config(parse_args(["unused"]), build_tokenizer().get_vocab_size(), build_tokenizer())
    n = sum(torch.Size(shape).numel() for shape in demo_shapes(config).values())
    assert 90e6 <= n <= 110e6


def test_demo_model_is_deterministic_and_loads_in_transformers(tmp_path):
    first, second = make(tmp_path / "a"), make(tmp_path / "b")
    assert digest(first) == digest(second)
    files = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert set(digest(first)) == files

    tokenizer = AutoTokenizer.from_pretrained(first)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True)
    assert tokenizer.decode(chat) == "<|begin_of_text|><|user|>hello<|assistant|>"
    ids = tokenizer("The planner splits layers into stages.").input_ids
    assert tokenizer.decode(ids) == "The planner splits layers into stages."

    model = LlamaForCausalLM.from_pretrained(first).eval()
    assert model.config.vocab_size == len(tokenizer)
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=tokenizer.eos_token_id,
        )[0, len(ids):].tolist()
    stages = [Stage.load(first, 0, 1), Stage.load(first, 1, 2)]
    assert generate(stages, [ids], max_new_tokens=8)[0] == expected
