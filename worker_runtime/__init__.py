"""The torch side of motley: stages of a LLaMA-family model, quantized and batched (no Django, no Celery).

Public API (documented in docs/worker_runtime.md)::

    from worker_runtime import Stage, Batch, SamplingParams, sample
    stage = Stage.load(model_dir, start, end, device="cpu", dtype=None, precision=Precision(16),
                       kv_tokens=4096)
    hidden_or_logits = stage.forward(Batch(...))
    tokens = sample(logits, [SamplingParams(...)], positions)

The names resolve lazily, so importing one submodule never imports the others (or torch) needlessly.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Batch": "stage",
    "Stage": "stage",
    "StageMemory": "stage",
    "KVBudgetExceeded": "kv_cache",
    "KVCache": "kv_cache",
    "QuantizationError": "quantize",
    "SamplingParams": "sampling",
    "sample": "sampling",
    "generate": "chain",
    "run_stages": "chain",
    "free_sequences": "chain",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'worker_runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
