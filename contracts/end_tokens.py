"""Which tokens end generation, read from a checkpoint directory's JSON files.

The gateway stops a sequence on them, and a grammar-constrained sequence's sampler allows them once its
grammar is complete (worker_runtime/structured.py); both read them here so that the token a grammar
ends with is one the gateway stops on. Every end token the checkpoint declares: the tokenizer's
``eos_token`` (tokenizer_config.json) first, then the ``eos_token_id`` (an int or a list) of
``config.json`` and ``generation_config.json`` (SmolLM2: ``<|im_end|>`` and ``<|endoftext|>``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict:
    """A checkpoint's JSON file, or {} where it has none."""
    return json.loads(path.read_text()) if path.exists() else {}


def token_text(value: str | dict | None) -> str | None:
    """tokenizer_config.json names special tokens as strings or as AddedToken dicts."""
    return value.get("content") if isinstance(value, dict) else value


def config_eos_ids(*configs: dict[str, Any]) -> tuple[int, ...]:
    """``eos_token_id`` of each config (an int, a list of ints, or absent), in order, without repeats."""
    ids: list[int] = []
    for config in configs:
        value = config.get("eos_token_id")
        for token_id in value if isinstance(value, list) else [value]:
            if isinstance(token_id, int) and not isinstance(token_id, bool) and token_id not in ids:
                ids.append(token_id)
    return tuple(ids)


def end_token_ids(eos_token_id: int | None, model_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The tokenizer's EOS first (where it has an id), then the model's own list, without repeats."""
    ids = ((eos_token_id,) if eos_token_id is not None else ()) + model_ids
    return tuple(dict.fromkeys(ids))


def checkpoint_end_tokens(directory: str | Path, token_id: Callable[[str], int | None]) -> tuple[int, ...]:
    """Every end token of the checkpoint in ``directory``; ``token_id`` maps a token's text to its id
    (the caller's tokenizer)."""
    directory = Path(directory)
    eos = token_text(read_json(directory / "tokenizer_config.json").get("eos_token"))
    model_ids = config_eos_ids(read_json(directory / "config.json"),
                               read_json(directory / "generation_config.json"))
    return end_token_ids(token_id(eos) if eos else None, model_ids)
