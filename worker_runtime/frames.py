"""The wire format of every pipeline message: an HMAC, a small JSON header, then raw tensor bytes.

A message is the multipart ``[mac, header, tensor_0, tensor_1, ...]``. ``header`` is UTF-8 JSON with
``type``, ``pipeline_id`` and a ``tensors`` list of ``{"dtype", "shape"}``; each tensor part is the
tensor's bytes as they lie in memory, so sending is zero-copy and receiving is a view, and nothing
is ever unpickled. ``mac`` is HMAC-SHA256 of the header under the pipeline's auth token: the token
itself never travels, a peer without it cannot forge a header, and a message for another pipeline
fails the check. Tensor bytes are not covered (hashing megabytes per hop costs more than the hop);
see docs/pipeline.md for the threat model.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_HEADER_BYTES = 8 << 20
MAX_DIMS = 8  # the pipeline sends at most 2-d tensors; more is a malformed header
MAX_DIM = 1 << 40  # per dimension: far above any real tensor, far below torch's int64 overflow
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# Received buffers are read-only and the stages only read them: torch's warning about it is noise.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


class FrameError(ValueError):
    """A message that is not a well-formed, authenticated frame of this pipeline; it is dropped."""


@dataclass
class Frame:
    header: dict[str, Any]
    tensors: list[torch.Tensor] = field(default_factory=list)

    @property
    def type(self) -> str:
        return self.header["type"]


class FrameCodec:
    """Encodes and authenticates frames of one pipeline (one token, one pipeline id)."""

    def __init__(self, pipeline_id: str, auth_token: str):
        self.pipeline_id = pipeline_id
        self._key = auth_token.encode()

    def _mac(self, header: bytes) -> bytes:
        return hmac.new(self._key, header, hashlib.sha256).digest()

    def encode(self, header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> list[Any]:
        """The parts of a message; tensor parts are memory views of the (contiguous) tensors."""
        specs, parts = [], []
        for tensor in tensors:
            tensor = tensor.detach().cpu().contiguous()
            if tensor.dtype not in DTYPE_NAMES:
                raise ValueError(f"cannot send tensors of dtype {tensor.dtype}")
            specs.append({"dtype": DTYPE_NAMES[tensor.dtype], "shape": list(tensor.shape)})
            parts.append(tensor.reshape(-1).view(torch.uint8).numpy())
        body = json.dumps({**header, "pipeline_id": self.pipeline_id, "tensors": specs}).encode()
        return [self._mac(body), body, *parts]

    def decode(self, parts: list[Any]) -> Frame:
        """Check and parse a received message; raises :class:`FrameError` saying what is wrong."""
        if len(parts) < 2:
            raise FrameError(f"a frame has at least 2 parts (mac, header), got {len(parts)}")
        mac, body = bytes(parts[0]), bytes(parts[1])
        if len(body) > MAX_HEADER_BYTES:
            raise FrameError(f"header of {len(body)} bytes is over the {MAX_HEADER_BYTES} limit")
        if not hmac.compare_digest(mac, self._mac(body)):
            raise FrameError("bad authentication (wrong auth token or tampered header)")
        try:
            header = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise FrameError(f"header is not JSON: {exc}") from exc
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise FrameError("header must be a JSON object with a string 'type'")
        if header.get("pipeline_id") != self.pipeline_id:
            raise FrameError(f"frame of pipeline {header.get('pipeline_id')!r}, this is {self.pipeline_id!r}")
        specs = header.get("tensors")
        if not isinstance(specs, list) or len(specs) != len(parts) - 2:
            raise FrameError("header 'tensors' must describe each tensor part")
        tensors = [self._tensor(spec, part) for spec, part in zip(specs, parts[2:])]
        return Frame(header, tensors)

    @staticmethod
    def _tensor(spec: Any, part: Any) -> torch.Tensor:
        """The tensor a part holds, once its description is exactly ``{"dtype": name, "shape": [int, ...]}``
        with sizes torch can take (a huge or fractional size must not reach torch: it raises there)."""
        dtype = DTYPES.get(spec.get("dtype")) if isinstance(spec, dict) and isinstance(spec.get("dtype"), str) else None
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if (
            dtype is None
            or not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
        ):
            raise FrameError(f"bad tensor description {spec!r}"[:300])
        buffer = memoryview(part)
        expected = math.prod(shape) * dtype.itemsize
        if buffer.nbytes != expected:
            raise FrameError(f"tensor part of {buffer.nbytes} bytes does not match {spec!r}"[:300])
        if expected == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).reshape(shape)
