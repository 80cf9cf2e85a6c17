"""Quantized layers kept on disk between a node's stage processes, so a stage restarted in place does
not quantize them again.

Quantizing on a CPU is most of a quantized stage's load: int4, ~0.1 s a layer of the demo model
(768 wide) against ~0.03 s to read it as fp32, and a stage's load is part of an in-place handover's
pause (a boundary move reloads both stages beside the boundary, with every layer they keep). The
bytes are the same every time a layer is quantized from the same checkpoint into the same layout, so
the first process that quantizes one writes its tensors here and the next reads them back: in a
boundary move every layer but the one that moved is read back, and the moved one too when its
precision did not change (it was quantized where it was).

An entry is named by the checkpoint's files (name, size, modification time), the module's name and
the names, shapes and dtypes of its tensors as constructed (which say the precision, group size and
kernel layout), so a changed checkpoint or layout is a miss, never a wrong tensor. Entries are
safetensors files (nothing here unpickles), written to a temporary name and renamed, so two stages
quantizing the same layer at once each leave a whole file. Only CPU stages use it: on a GPU the
quantization runs on the device. The folder holds each layer at each precision this node has loaded
(at most the model's size once per precision) and is not trimmed; deleting it costs one quantization.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn


class WeightCache:
    def __init__(self, folder: str | Path, model_dir: str | Path):
        self.folder = Path(folder)
        files = sorted(Path(model_dir).glob("*.safetensors"))
        identity = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
        self._checkpoint = repr(identity)

    def restore(self, name: str, module: nn.Module) -> bool:
        """Copy the cached tensors of ``module`` (constructed, not loaded) into it; False on a miss."""
        try:
            cached = load_file(self._path(name, module))
        except (OSError, ValueError, RuntimeError):  # absent, or a file another process cut short
            return False
        state = module.state_dict(keep_vars=True)
        if cached.keys() != state.keys():
            return False
        with torch.no_grad():
            for key, tensor in state.items():
                tensor.copy_(cached[key])
        return True

    def store(self, name: str, module: nn.Module) -> None:
        """Write ``module``'s loaded tensors for the next process (best effort: a full disk only costs
        that process the quantization)."""
        path = self._path(name, module)
        try:
            self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, temporary = tempfile.mkstemp(dir=self.folder, suffix=".part")
        except OSError:
            return
        os.close(fd)
        try:
            save_file({k: t.contiguous() for k, t in module.state_dict().items()}, temporary)
            os.replace(temporary, path)
        except OSError:
            Path(temporary).unlink(missing_ok=True)

    def _path(self, name: str, module: nn.Module) -> Path:
        shapes = [(k, tuple(t.shape), str(t.dtype)) for k, t in module.state_dict().items()]
        digest = hashlib.sha256(repr((self._checkpoint, name, shapes)).encode()).hexdigest()[:32]
        return self.folder / f"{digest}.safetensors"


def load_through(cache: WeightCache | None, name: str, module: nn.Module, load: Callable[[], None]) -> None:
    """Fill ``module``: from ``cache`` where it holds it, else by ``load()``, then kept there for the next
    process (``cache`` None: only ``load()``; a stage passes None for what it does not quantize)."""
    if cache is not None and cache.restore(name, module):
        return
    load()
    if cache is not None:
        cache.store(name, module)
