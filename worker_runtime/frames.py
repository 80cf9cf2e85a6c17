"""The stages' side of the pipeline's wire format: the envelope (``contracts.pipeline_frames``) with its
parts as torch tensors.

Each tensor part is the tensor's bytes as they lie in memory, so sending is zero-copy and receiving
is a view; the envelope (HMAC, JSON header, each part's description and size) is checked by
``contracts.pipeline_frames.EnvelopeCodec``, which the gateway's pipeline client shares torch-free.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from contracts.pipeline_frames import DTYPE_SIZES, EnvelopeCodec, FrameError, RawPart

__all__ = ["DTYPES", "Frame", "FrameCodec", "FrameError"]

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
if {name: dtype.itemsize for name, dtype in DTYPES.items()} != DTYPE_SIZES:
    raise ImportError("worker_runtime.frames.DTYPES must match contracts.pipeline_frames.DTYPE_SIZES")
# Received buffers are read-only and the stages only read them: torch's warning about it is noise.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


@dataclass
class Frame:
    header: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.header["type"]


class FrameCodec(EnvelopeCodec):
    """Encodes and authenticates frames of one pipeline (one token, one pipeline id)."""

    def encode(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> list[Any]:
        """The parts of a message; tensor parts are memory views of the (contiguous) tensors."""
        specs, parts = [], []
        for tensor in tensors:
            tensor = tensor.detach().cpu().contiguous()
            if tensor.dtype not in DTYPE_NAMES:
                raise ValueError(f"cannot send tensors of dtype {tensor.dtype}")
            specs.append({"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)})
            parts.append(tensor.reshape(-1).view(torch.uint8).numpy())
        return self.encode_parts(header, specs, parts)

    def decode(self, parts: list[Any]) -> Frame:
        """Check and parse a received message; raises :class:`FrameError` saying what is wrong."""
        header, raw = self.decode_parts(parts)
        return Frame(header, [self._tensor(part) for part in raw])

    @staticmethod
    def _tensor(part: RawPart) -> torch.Tensor:
        """The tensor a checked part holds: a view of its bytes."""
        dtype = DTYPES[part.dtype]
        if part.data.nbytes == 0:
            return torch.empty(part.shape, dtype=dtype)
        return torch.frombuffer(part.data, dtype=torch.uint8).view(dtype).reshape(part.shape)
