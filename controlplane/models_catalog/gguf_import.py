"""Import a GGUF file (llama.cpp, Ollama, LM Studio) as the Hugging Face-format checkpoint motley serves.

``import_gguf(path, out_dir, dtype=...)`` reads the file with the ``gguf`` package, dequantizes each
tensor with ``gguf.quants.dequantize`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants
Q2_K..Q6_K, whatever that package can), renames it to the Hugging Face layout, undoes the rotary
permutation llama.cpp applies to LLaMA's q/k projections, and writes ``model.safetensors`` (sharded
with an index past ``shard_bytes``), ``config.json``, ``generation_config.json``, ``tokenizer.json``,
``tokenizer_config.json`` (with the chat template) and ``gguf_import.json`` (where it came from).
Everything is written into a temporary directory beside ``out_dir`` and renamed into place, so a
failed import leaves nothing behind. Architectures: ``llama`` (LLaMA 1-3 and Mistral, which llama.cpp
stores as llama) and ``qwen2``; anything else is refused by name.

Django-free (the control plane calls it from model registration); torch only to write the tensors,
never transformers (docs/models.md).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from controlplane.models_catalog import gguf_tokenizer

ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
DTYPES = ("float32", "float16", "bfloat16")
RECORD = "gguf_import.json"
MAGIC = b"GGUF"

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
IGNORED = re.compile(r"rope_freqs\.weight|blk\.\d+\.attn_rot_embd(\.weight)?")  # folded into the config


class GGUFImportError(ValueError):
    """The file cannot be imported; the message names the file and what is wrong with it."""


def import_gguf(
    path: str | Path, out_dir: str | Path, *, dtype: str = "float16", shard_bytes: int = 2 << 30
) -> Path:
    """Convert ``path`` into a checkpoint directory ``out_dir`` (replaced if it exists); returns it."""
    import torch

    path, out_dir = Path(path), Path(out_dir)
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    reader = open_gguf(path)
    fields = read_fields(reader)
    tensors = {t.name: t for t in reader.tensors}
    config = hf_config(fields, tensors, dtype, path)
    try:
        tokenizer = gguf_tokenizer.build_tokenizer(fields, fields["general.architecture"])
    except ValueError as exc:
        raise GGUFImportError(f"{path}: {exc}") from None
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.importing-", dir=out_dir.parent))
    try:
        shards = _Shards(work, shard_bytes)
        for name, tensor in tensors.items():
            if IGNORED.fullmatch(name):
                continue
            values = _dequantize(path, tensor)
            if fields["general.architecture"] == "llama" and re.search(r"\.attn_[qk]\.", name):
                heads = config["num_attention_heads"] if ".attn_q." in name else config["num_key_value_heads"]
                values = unpermute_rotary(values, heads)
            shards.add(hf_name(name), torch.from_numpy(values).to(getattr(torch, dtype)).contiguous())
        shards.close()
        _write_json(work / "config.json", config)
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
        _write_json(work / "generation_config.json", generation)
        tokenizer.save(str(work / "tokenizer.json"))
        _write_json(work / "tokenizer_config.json",
                    gguf_tokenizer.tokenizer_config(fields, config["max_position_embeddings"]))
        _write_json(work / RECORD, import_record(path, fields, tensors, dtype))
        _replace(work, out_dir)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return out_dir


def open_gguf(path: Path):
    """A ``gguf.GGUFReader`` over the file, or a GGUFImportError saying why it is not a usable GGUF file."""
    from gguf import GGUFReader

    try:
        with path.open("rb") as file:
            head = file.read(4)
        size = path.stat().st_size
    except OSError as exc:
        raise GGUFImportError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if head != MAGIC:
        raise GGUFImportError(
            f"{path}: not a GGUF file (it starts with {head!r}, a GGUF file with {MAGIC!r})"
            if head else f"{path}: not a GGUF file (it is empty)"
        )
    try:
        reader = GGUFReader(path)
    except Exception as exc:  # the reader fails in many ways on a cut file (a header, a tensor cut short)
        raise GGUFImportError(f"{path}: truncated or corrupt GGUF file ({size} bytes): {exc}") from None
    return reader


def read_fields(reader) -> dict[str, Any]:
    """Every metadata key with its value (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def hf_config(fields: dict[str, Any], tensors: dict[str, Any], dtype: str, path: Path) -> dict[str, Any]:
    """The Hugging Face ``config.json`` of the file's model, or a GGUFImportError naming the field."""
    arch = fields.get("general.architecture")
    if (fields.get("split.count") or 1) > 1:
        raise GGUFImportError(
            f"{path}: one part of a split GGUF file ({fields['split.count']} parts); merge them first "
            "(llama-gguf-split --merge)"
        )
    if arch not in ("llama", "qwen2"):
        raise GGUFImportError(
            f"{path}: GGUF architecture {arch!r} is not supported "
            "(supported: llama, for LLaMA 1-3 and Mistral; qwen2)"
        )

    def need(key: str) -> int:
        value = fields.get(f"{arch}.{key}")
        if not isinstance(value, int) or value <= 0:
            raise GGUFImportError(f"{path}: {arch}.{key}: expected a positive integer, got {value!r}")
        return value

    for name in tensors:
        if not IGNORED.fullmatch(name) and hf_name(name) is None:
            raise GGUFImportError(
                f"{path}: tensor {name!r} has no place in a {arch} checkpoint (mixture of experts or another "
                "variant this import does not know)"
            )
    hidden, layers, heads = need("embedding_length"), need("block_count"), need("attention.head_count")
    kv_heads = fields.get(f"{arch}.attention.head_count_kv") or heads
    head_dim = fields.get(f"{arch}.attention.key_length") or hidden // heads
    rotary = fields.get(f"{arch}.rope.dimension_count") or head_dim
    if rotary != head_dim:
        raise GGUFImportError(f"{path}: {arch}.rope.dimension_count: partial rotary ({rotary} of {head_dim}) "
                              "is not supported")
    _check_tensors(path, tensors, layers, biases=arch == "qwen2")
    name = str(fields.get("general.name") or "")
    model_type = "mistral" if arch == "llama" and "mistral" in name.lower() else arch
    context = int(fields.get(f"{arch}.context_length") or 4096)
    tokens = fields.get("tokenizer.ggml.tokens") or []
    stops = gguf_tokenizer.stop_token_ids(fields) if tokens else []
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": context,
        "rms_norm_eps": _short_float(fields.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": _short_float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": rope_scaling(fields, tensors, arch, head_dim, path),
        "vocab_size": int(tensors["token_embd.weight"].shape[1]),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": arch == "qwen2" or "blk.0.attn_q.bias" in tensors,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "sliding_window": None,
        "use_sliding_window": False,
    }
    for key, field in (("bos_token_id", "bos"), ("pad_token_id", "padding")):
        value = fields.get(f"tokenizer.ggml.{field}_token_id")
        if isinstance(value, int) and 0 <= value < len(tokens):
            config[key] = value
    if stops:
        config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    return config


def rope_scaling(fields: dict[str, Any], tensors: dict[str, Any], arch: str, head_dim: int, path: Path):
    """Rotary scaling: none, linear, or Llama 3's (llama.cpp stores it as per-frequency ``rope_freqs``)."""
    kind = fields.get(f"{arch}.rope.scaling.type", "none")
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(fields[f"{arch}.rope.scaling.factor"])}
    if kind != "none":
        raise GGUFImportError(f"{path}: {arch}.rope.scaling.type: {kind!r} is not supported (none, linear)")
    if "rope_freqs.weight" not in tensors:
        return None
    factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float64).reshape(-1)
    base = float(fields.get(f"{arch}.rope.freq_base", 10000.0))
    scaling = {"rope_type": "llama3", "factor": float(factors.max()), "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    expected = llama3_factors(head_dim, base, scaling)
    if factors.shape != expected.shape or not np.allclose(expected, factors, rtol=1e-4):
        raise GGUFImportError(
            f"{path}: rope_freqs.weight: per-frequency rotary factors other than Llama 3's scaling "
            "(factor, low 1, high 4, original context 8192) are not supported"
        )
    return scaling


def llama3_factors(head_dim: int, base: float, scaling: dict[str, Any]) -> np.ndarray:
    """What llama.cpp's converter stores as ``rope_freqs`` for Llama 3's rotary scaling."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi * base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    smooth = (context / wavelen - low) / (high - low)
    middle = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < context / high, 1.0, np.where(wavelen > context / low, factor, middle))


def hf_name(name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name, None for one without a place in the layout."""
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    match = LAYER_TENSOR.fullmatch(name)
    if match and match[2] in LAYER_NAMES:
        return f"model.layers.{match[1]}.{LAYER_NAMES[match[2]]}.{match[3]}"
    return None


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation (its converter pairs rotary halves as interleaved rows)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def import_record(path: Path, fields: dict[str, Any], tensors: dict[str, Any], dtype: str) -> dict[str, Any]:
    """``gguf_import.json``: the source file (whether a stored import is still current) and its make-up."""
    stat = path.stat()
    return {
        "source": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "dtype": dtype,
        "architecture": fields.get("general.architecture"), "name": fields.get("general.name"),
        "tensor_types": dict(Counter(t.tensor_type.name for t in tensors.values())),
    }


def read_record(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / RECORD).read_text())
    except (OSError, ValueError):
        return None


def is_current(out_dir: Path, path: Path, dtype: str) -> bool:
    """Whether ``out_dir`` holds an import of this very file (same size and time) at this dtype."""
    record, stat = read_record(out_dir), path.stat()
    return record is not None and (record.get("source"), record.get("size"), record.get("mtime_ns"),
                                   record.get("dtype")) == (str(path), stat.st_size, stat.st_mtime_ns, dtype)


def _check_tensors(path: Path, tensors: dict[str, Any], layers: int, *, biases: bool) -> None:
    wanted = ["token_embd.weight", "output_norm.weight"]
    for i in range(layers):
        wanted += [f"blk.{i}.{part}.weight" for part in LAYER_NAMES]
        wanted += [f"blk.{i}.attn_{p}.bias" for p in "qkv"] if biases else []
    missing = [name for name in wanted if name not in tensors]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise GGUFImportError(f"{path}: tensors missing: {', '.join(missing[:3])}{more}")


def _dequantize(path: Path, tensor) -> np.ndarray:
    from gguf.quants import dequantize

    try:
        values = dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError:
        raise GGUFImportError(
            f"{path}: tensor {tensor.name} is stored as {tensor.tensor_type.name}: gguf cannot dequantize it"
        ) from None
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions innermost first
    return np.array(values, dtype=np.float32, order="C").reshape(shape)  # a copy: the file is read-only


class _Shards:
    """Tensors into ``model.safetensors``, or into shards of about ``limit`` bytes with an index."""

    def __init__(self, work: Path, limit: int) -> None:
        self.work, self.limit = work, limit
        self.current: dict[str, Any] = {}
        self.size, self.count = 0, 0
        self.weight_map: dict[str, int] = {}

    def add(self, name: str, tensor) -> None:
        if self.current and self.size + tensor.nbytes > self.limit:
            self._write()
        self.current[name], self.weight_map[name] = tensor, self.count + 1
        self.size += tensor.nbytes

    def close(self) -> None:
        self._write()
        if self.count == 1:
            (self.work / "model-00001.safetensors").rename(self.work / "model.safetensors")
            return
        names = {i: f"model-{i:05d}-of-{self.count:05d}.safetensors" for i in range(1, self.count + 1)}
        for index, final in names.items():
            (self.work / f"model-{index:05d}.safetensors").rename(self.work / final)
        weight_map = {name: names[index] for name, index in self.weight_map.items()}
        _write_json(self.work / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})

    def _write(self) -> None:
        from safetensors.torch import save_file

        self.count += 1
        save_file(self.current, self.work / f"model-{self.count:05d}.safetensors", metadata={"format": "pt"})
        self.current, self.size = {}, 0


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _replace(work: Path, out_dir: Path) -> None:
    """Move the finished import into place; an older one is removed only after the new one is there."""
    os.chmod(work, 0o755)
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        out_dir.rename(old / out_dir.name)
    work.rename(out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _short_float(value: float) -> float:
    """A float32 metadata value as its shortest decimal (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(value)))
