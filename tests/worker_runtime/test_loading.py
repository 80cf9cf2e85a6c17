"""Loading reads only a stage's own tensors, from single or sharded files, within 1.3x of its size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from worker_runtime import Batch, Stage
from worker_runtime.make_demo_model import parse_args, write_demo_model

REPO = Path(__file__).resolve().parents[2]


def copy_checkpoint(src: Path, dst: Path, keep, shards: int = 1) -> Path:
    """A copy of ``src`` holding only the tensors ``keep(name)`` accepts, split into ``shards`` files."""
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    with safe_open(src / "model.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys() if keep(name)}
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, dst / "model.safetensors")
        return dst
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, dst / file)
        weight_map |= dict.fromkeys(part, file)
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def stage_output(stage: Stage, prompt: list[int]) -> torch.Tensor:
    batch = Batch.of_tokens([0], [prompt], [0])
    if not stage.is_first:
        batch = batch.with_hidden(torch.randn(len(prompt), 64, generator=torch.Generator().manual_seed(0)))
    return stage.forward(batch)


def test_a_stage_needs_only_its_own_layers_tensors(checkpoints, tmp_path):
    src = checkpoints["qwen2_bias"]
    keep = ("model.layers.1.", "model.layers.2.")
    only_middle = copy_checkpoint(src, tmp_path / "middle", lambda n: n.startswith(keep))
    prompt = list(range(3, 12))
    partial = Stage.load(only_middle, 1, 3)
    torch.testing.assert_close(stage_output(partial, prompt), stage_output(Stage.load(src, 1, 3), prompt))
    with pytest.raises(KeyError, match="model.layers.0"):
        Stage.load(only_middle, 0, 2)
    with pytest.raises(KeyError, match="model.layers.3"):
        Stage.load(only_middle, 2, 5)


def test_sharded_checkpoints_load_the_same_stage(checkpoints, tmp_path):
    src = checkpoints["llama_gqa_llama3"]
    sharded = copy_checkpoint(src, tmp_path / "sharded", lambda n: True, shards=3)
    assert not (sharded / "model.safetensors").exists()
    prompt = list(range(3, 12))
    for start, end in [(0, 2), (2, 4)]:
        expected = stage_output(Stage.load(src, start, end), prompt)
        torch.testing.assert_close(stage_output(Stage.load(sharded, start, end), prompt), expected)


def test_a_stage_loads_in_a_chosen_dtype(checkpoints):
    stage = Stage.load(checkpoints["llama_gqa_llama3"], 0, 4, dtype=torch.bfloat16)
    assert {p.dtype for p in stage.parameters()} == {torch.bfloat16} and stage.kv.k.dtype == torch.bfloat16
    assert set(stage.memory().weight_bytes_by_kind) == {"bfloat16"}


def test_layer_ranges_outside_the_model_are_refused(checkpoints):
    for start, end in [(0, 0), (3, 2), (-1, 2), (0, 5)]:
        with pytest.raises(ValueError, match="not within the model's 4 layers"):
            Stage.load(checkpoints["llama_gqa_llama3"], start, end)


@pytest.fixture(scope="module")
def two_layer_demo(tmp_path_factory) -> Path:
    """Two layers of the demo model's shape (hidden 768, intermediate 2048): real per-layer sizes."""
    out = tmp_path_factory.mktemp("two_layer_demo")
    write_demo_model(parse_args([str(out), "--layers", "2"]))
    return out


@pytest.mark.parametrize("start,end,bits", [(0, 1, 16), (1, 2, 8), (1, 2, 4)])
def test_peak_memory_while_loading_stays_within_1_3x_of_the_stage(two_layer_demo, start, end, bits):
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONPATH": str(REPO)}
    script = Path(__file__).with_name("peak_load_memory.py")
    result = subprocess.run(
        [sys.executable, str(script), str(two_layer_demo), str(start), str(end), str(bits)],
        env=env, capture_output=True, text=True, check=True, timeout=120,
    )
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["peak"] <= 1.3 * measured["stage"], measured
