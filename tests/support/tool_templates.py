"""Real chat templates that define tools (Qwen 2.5, Llama 3.1, Mistral v3 as their checkpoints ship
them in tokenizer_config.json; the files in chat_templates/), and tiny checkpoints that carry them: the
demo checkpoint with its reserved special tokens renamed to each family's, so the vocabulary (and the
weights) stay the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEMPLATES = Path(__file__).with_name("chat_templates")
QWEN2_5, LLAMA3_1, MISTRAL_V3 = ((TEMPLATES / f"{name}.jinja").read_text()
                                 for name in ("qwen2_5", "llama3_1", "mistral_v3"))

CONTEXT = 2048

# Each family: its template, its tokens (name -> special), its end-of-turn token.
FAMILIES = {
    "qwen2_5": (QWEN2_5, {"<|im_start|>": True, "<|im_end|>": True, "<tool_call>": False,
                          "</tool_call>": False}, "<|im_end|>"),
    "llama3_1": (LLAMA3_1, {"<|start_header_id|>": True, "<|end_header_id|>": True, "<|eot_id|>": True,
                            "<|eom_id|>": True, "<|python_tag|>": True}, "<|eot_id|>"),
    "mistral_v3": (MISTRAL_V3, {"[INST]": True, "[/INST]": True, "[TOOL_CALLS]": True,
                                "[AVAILABLE_TOOLS]": True, "[/AVAILABLE_TOOLS]": True,
                                "[TOOL_RESULTS]": True, "[/TOOL_RESULTS]": True}, "<|end_of_text|>"),
}


def write_tool_checkpoint(source: Path, out: Path, family: str) -> Path:
    """A copy of the demo checkpoint ``source`` whose tokenizer has ``family``'s tokens (reserved
    tokens renamed, ids unchanged), whose tokenizer_config.json has its template and end token, and
    whose context holds a prompt with tools (RoPE has no learned positions, so the weights serve it)."""
    template, tokens, eos = FAMILIES[family]
    shutil.copytree(source, out)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    reserved = [t for t in tokenizer["added_tokens"] if t["content"].startswith("<|reserved_")]
    for entry, (content, special) in zip(reserved, tokens.items(), strict=False):
        entry["content"], entry["special"] = content, special
    (out / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((out / "tokenizer_config.json").read_text())
    config |= {"chat_template": template, "eos_token": eos, "model_max_length": CONTEXT}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    model_config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(model_config | {"max_position_embeddings": CONTEXT}))
    return out
