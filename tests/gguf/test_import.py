"""The import on tiny GGUF files written as llama.cpp writes them: each architecture and tokenizer kind
against transformers' GGUF loader, every tensor type, sharding, rotary scaling, and bad files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from contracts.model_config import ModelConfig
from controlplane.models_catalog import gguf_import
from controlplane.models_catalog.gguf_import import GGUFImportError, import_gguf
from worker_runtime import Batch, Stage, run_stages

from .tiny import LAYERS, TYPES, write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["The quick brown fox", "Ünïcödé café 日本 🙂 12345", " two  spaces\n\n\tx ", "what's (a), [b]?", ""]


@pytest.fixture(scope="module")
def imported(tiny_ggufs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported")
    return {name: import_gguf(path, root / name, dtype="float32") for name, path in tiny_ggufs.items()}


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2"])
def test_each_architecture_matches_transformers(tiny_ggufs, imported, variant):
    reference = hf_model(tiny_ggufs[variant])
    ours = load_file(imported[variant] / "model.safetensors")
    for name, tensor in reference.state_dict().items():
        if name in ours or name != "lm_head.weight":
            assert torch.equal(ours[name], tensor), name
    ids = list(range(3, 40))
    with torch.no_grad():
        want = reference(torch.tensor([ids])).logits[0]
    for partition in ([(0, LAYERS)], [(i, i + 1) for i in range(LAYERS)]):
        stages = [Stage.load(imported[variant], a, b) for a, b in partition]
        got = run_stages(stages, Batch.of_tokens([1], [ids], [0]), all_logits=True)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    config = ModelConfig.from_file(imported[variant])
    assert config.model_type == variant and config.tie_word_embeddings == (variant == "mistral")
    assert config.attention_bias == (variant == "qwen2") and config.sliding_window is None


@pytest.mark.parametrize("variant", ["llama", "mistral", "qwen2"])
def test_each_tokenizer_kind_encodes_as_transformers(tiny_ggufs, imported, variant):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(tiny_ggufs[variant].parent, gguf_file=tiny_ggufs[variant].name)
    ours = Tokenizer.from_file(str(imported[variant] / "tokenizer.json"))
    specials = "<|im_start|>user\nhi<|im_end|>" if variant != "mistral" else "<s>hi</s>"
    for text in [*TEXTS, specials]:
        ids = ours.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text, add_special_tokens=False), text
        if text != specials:  # SentencePiece puts a space before a word after a special token
            assert ours.decode(ids) == text
    config = json.loads((imported[variant] / "tokenizer_config.json").read_text())
    bos = variant == "mistral"  # SentencePiece files add BOS unless they say otherwise (llama.cpp's default)
    assert config["add_bos_token"] is bos and (ours.encode("hi").ids[0] == 1) is bos


def test_every_tensor_type_is_dequantized(imported):
    record = json.loads((imported["llama"] / "gguf_import.json").read_text())
    assert set(record["tensor_types"]) == {t.name for t in TYPES}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_storage_dtypes_round_the_float32_import(tiny_ggufs, imported, tmp_path, dtype):
    out = import_gguf(tiny_ggufs["qwen2"], tmp_path / "m", dtype=dtype)
    stored, full = load_file(out / "model.safetensors"), load_file(imported["qwen2"] / "model.safetensors")
    for name, tensor in stored.items():
        assert torch.equal(tensor, full[name].to(getattr(torch, dtype))), name
    assert ModelConfig.from_file(out).torch_dtype == dtype


def test_large_models_are_written_in_shards(tiny_ggufs, imported, tmp_path):
    out = import_gguf(tiny_ggufs["llama"], tmp_path / "m", dtype="float32", shard_bytes=1 << 20)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted({*index["weight_map"].values()})
    assert len(files) > 2 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    assert not (out / "model.safetensors").exists()
    ids = list(range(3, 20))
    sharded, whole = (run_stages([Stage.load(d, 0, LAYERS)], Batch.of_tokens([1], [ids], [0]))
                      for d in (out, imported["llama"]))
    assert torch.equal(sharded, whole)


def test_llama3_rotary_scaling_is_read_from_rope_freqs(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    out = import_gguf(write_tiny_gguf(tmp_path / "l3.gguf", rope_scaling=scaling), tmp_path / "l3")
    assert json.loads((out / "config.json").read_text())["rope_scaling"] == scaling
    odd = {"rope_freqs.weight": np.linspace(1, 3, 32, dtype=np.float32)}
    with pytest.raises(GGUFImportError, match="rope_freqs.weight: per-frequency rotary factors other than"):
        import_gguf(write_tiny_gguf(tmp_path / "odd.gguf", extra_tensors=odd), tmp_path / "odd")


def test_the_import_does_not_need_transformers(tiny_ggufs, tmp_path):
    script = (
        "import sys; sys.modules['transformers'] = None\n"
        "from controlplane.models_catalog.gguf_import import import_gguf\n"
        f"import_gguf({str(tiny_ggufs['mistral'])!r}, {str(tmp_path / 'm')!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300)
    assert (tmp_path / "m" / "model.safetensors").is_file()


# Bad files: a clear error naming the problem, and nothing written.

def refused(path: Path, out: Path, *fragments: str) -> None:
    with pytest.raises(GGUFImportError) as error:
        import_gguf(path, out)
    for fragment in fragments:
        assert fragment in str(error.value), str(error.value)
    assert str(path) in str(error.value)
    assert not out.exists() and [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def cut(source: Path, path: Path, size: int) -> Path:
    path.write_bytes(source.read_bytes()[:size])
    return path


def test_truncated_files(tiny_ggufs, tmp_path):
    source = tiny_ggufs["llama"]
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "m"
    for size in (6, 100, 5000, source.stat().st_size // 2, source.stat().st_size - 1):
        refused(cut(source, tmp_path / f"cut{size}.gguf", size), out,
                "truncated or corrupt GGUF file", f"({size} bytes)")


def test_not_a_gguf_file(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "empty.gguf").write_bytes(b"")
    refused(tmp_path / "empty.gguf", tmp_path / "out" / "m", "not a GGUF file (it is empty)")
    (tmp_path / "model.gguf").write_bytes(b"PK\x03\x04 a zip file")
    refused(tmp_path / "model.gguf", tmp_path / "out" / "m", "not a GGUF file (it starts with b'PK")
    refused(tmp_path / "missing.gguf", tmp_path / "out" / "m", "cannot read")


def test_unsupported_architectures_are_refused_by_name(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    (tmp_path / "out").mkdir()
    refused(tmp_path / "gpt2.gguf", tmp_path / "out" / "m", "GGUF architecture 'gpt2' is not supported",
            "llama, for LLaMA 1-3 and Mistral; qwen2")


def test_unknown_and_missing_tensors_are_refused(tmp_path):
    (tmp_path / "out").mkdir()
    experts = {"blk.0.ffn_gate_exps.weight": np.zeros((4, 8, 8), np.float32)}
    refused(write_tiny_gguf(tmp_path / "moe.gguf", extra_tensors=experts), tmp_path / "out" / "m",
            "tensor 'blk.0.ffn_gate_exps.weight' has no place in a llama checkpoint")
    hole = write_tiny_gguf(tmp_path / "hole.gguf", skip_tensors=("blk.1.ffn_up.weight",))
    refused(hole, tmp_path / "out" / "m", "tensors missing: blk.1.ffn_up.weight")
    part = write_tiny_gguf(tmp_path / "part.gguf", extra_ints={"split.count": 3})
    refused(part, tmp_path / "out" / "m", "one part of a split GGUF file (3 parts)", "gguf-split --merge")


def test_a_failure_midway_leaves_nothing_and_keeps_an_older_import(tiny_ggufs, tmp_path, monkeypatch):
    out = import_gguf(tiny_ggufs["llama"], tmp_path / "m")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []

    def failing(path, tensor):
        calls.append(tensor.name)
        if len(calls) == 5:
            raise GGUFImportError(f"{path}: tensor {tensor.name} is stored as X: gguf cannot dequantize it")
        return real(path, tensor)

    real = gguf_import._dequantize
    monkeypatch.setattr(gguf_import, "_dequantize", failing)
    with pytest.raises(GGUFImportError, match="cannot dequantize"):
        import_gguf(tiny_ggufs["qwen2"], out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_smollm2_is_found_through_the_wheels_metadata(monkeypatch):
    from importlib import metadata

    from controlplane.models_catalog import smollm2

    found = smollm2.smollm2_gguf_path()
    assert found is None or (found.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and found.is_file())

    def absent(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(smollm2.metadata, "distribution", absent)
    assert smollm2.smollm2_gguf_path() is None
