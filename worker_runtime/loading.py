"""Reading a stage's own tensors out of a Hugging Face safetensors checkpoint, block of rows by block.

safetensors memory-maps each file, so a stage touches only the bytes of the tensors it asks for.
Tensors are copied in row blocks of about ``CHUNK_BYTES`` (as fp32) straight into the stage's final
parameters (converted or quantized on the way), which keeps peak memory while loading to the stage's
final size plus one block, whatever the size of the embedding or the lm_head.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

# Small blocks keep the transient (a block plus its quantization temporaries) far below even an
# int4 stage's size; the per-block overhead is a few microseconds.
CHUNK_BYTES = 64 * 2**10
Span = tuple[int, int]  # [first, end) of rows or columns


class CheckpointReader:
    """Name -> file lookup over ``model.safetensors`` or a sharded ``model.safetensors.index.json``."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        index = self.model_dir / "model.safetensors.index.json"
        self._stack = ExitStack()
        self._handles: dict[str, object] = {}
        if index.exists():
            self._file_of = dict(json.loads(index.read_text())["weight_map"])
        else:
            single = self.model_dir / "model.safetensors"
            if not single.exists():
                raise FileNotFoundError(
                    f"{self.model_dir}: no model.safetensors or model.safetensors.index.json"
                )
            with safe_open(single, framework="pt") as f:
                self._file_of = {name: single.name for name in f.keys()}

    def __enter__(self) -> "CheckpointReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        self._handles.clear()

    def has(self, name: str) -> bool:
        return name in self._file_of

    def _handle(self, name: str):
        if name not in self._file_of:
            raise KeyError(f"{self.model_dir}: tensor {name!r} is not in the checkpoint")
        file = self._file_of[name]
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(safe_open(self.model_dir / file, framework="pt"))
        return self._handles[file]

    def shape(self, name: str) -> list[int]:
        return list(self._handle(name).get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        return self._handle(name).get_slice(name)[:0].dtype  # an empty slice: no bytes read

    def row_blocks(self, name: str, rows: Span | None = None,
                   columns: Span | None = None) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield (first row, rows) of tensor ``name`` in blocks of about ``CHUNK_BYTES`` (as fp32); with
        ``rows`` / ``columns`` ([first, end) each), only those rows / columns, rows counted from ``rows``'
        first (a tensor-parallel shard's slice: nothing outside it is read)."""
        tensor = self._handle(name).get_slice(name)
        shape = tensor.get_shape()
        first, end = rows or (0, shape[0])
        if len(shape) == 1:
            yield 0, tensor[first:end]
            return
        cut = slice(*columns) if columns else slice(None)
        step = max(16, CHUNK_BYTES // (shape[1] * 4))
        for start in range(first, end, step):
            yield start - first, tensor[start : min(start + step, end), cut]


RowWriter = Callable[[int, torch.Tensor], None]


def copy_rows_into(param: torch.Tensor) -> RowWriter:
    """A row writer that copies (and converts) blocks into a preallocated dense tensor."""

    def write(row0: int, rows: torch.Tensor) -> None:
        param[row0 : row0 + rows.shape[0]].copy_(rows)

    return write


def load_concatenated(reader: CheckpointReader, names: list[str], write: RowWriter,
                      rows: list[Span] | None = None, columns: Span | None = None) -> None:
    """Stream the tensors ``names``, concatenated along rows, through ``write`` (fused q/k/v, gate/up);
    ``rows``: only these rows of each tensor, ``columns``: only these columns of all (a shard's slices)."""
    offset = 0
    for i, name in enumerate(names):
        rows_read = 0
        for start, block in reader.row_blocks(name, rows[i] if rows else None, columns):
            write(offset + start, block)
            rows_read = start + block.shape[0]
        offset += rows_read
