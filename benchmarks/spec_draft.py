"""Part (c) of spec_bench.py: the draft-model drafter, on SmolLM2 with a draft that shares its tokenizer.

The draft is SmolLM2 itself cut to its first ``--draft-layers`` layers (the same embeddings, final
norm and tied lm_head: the only model here that shares its tokenizer and guesses its next token better
than chance). It is served as the runtime serves any draft, an ordinary one-stage pipeline with prefix
caching (worker_runtime/draft_client.py); the target is the one-stage pipeline of part (a) with
``speculation: "draft"`` linked to it, against the same pipeline with every request opting out.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from contracts.stage_spec import DraftLink
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs

LAYERS = 30  # SmolLM2-135M


def draft_checkpoint(model: Path, layers: int) -> Path:
    """``model`` cut to its first ``layers`` layers, beside it (made once)."""
    out = model.parent / f"{model.name}-first-{layers}"
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((model / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
    tensors = {}
    for file in sorted(model.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                tensors[name] = tensor
    save_file(tensors, out / "model.safetensors")
    for extra in model.iterdir():
        if extra.suffix != ".safetensors" and extra.name != "config.json" and extra.is_file():
            shutil.copy(extra, out / extra.name)
    return out


def with_draft(model: Path, layers: int, measure, prompts, args, workdir: Path, reference):
    """Part (a)'s pipeline with a draft of ``layers`` layers: ``measure``'s tallies (on: proposals from
    the draft; off: the same pipeline opted out), every text checked against ``reference``."""
    draft = draft_checkpoint(model, layers)
    for name in ("draft", "target"):
        (workdir / name).mkdir(exist_ok=True)
    drafter = Pipeline(pipeline_specs(draft, layers, 1, pipeline_id="draft", kv_tokens=4096),
                       workdir / "draft")
    try:
        drafter.wait_ready(timeout_s=120)
        link = DraftLink(address=drafter.head, pipeline_id="draft", auth_token=TOKEN)
        specs = pipeline_specs(model, LAYERS, 1, pipeline_id="bench", kv_tokens=2048, speculation="draft",
                               draft=dataclasses.asdict(link))
        target = Pipeline(specs, workdir / "target")
        try:
            target.wait_ready(timeout_s=120)
            return asyncio.run(measure(target.head, prompts, args.tokens, args.stop, reference))
        finally:
            target.stop()
    finally:
        drafter.stop()
