"""The envelope of every pipeline message, torch-free: an HMAC, a small JSON header, then raw parts.

A message is the multipart ``[mac, header, part_0, part_1, ...]``. ``header`` is UTF-8 JSON with
``type``, ``pipeline_id`` and a ``tensors`` list of ``{"dtype", "shape"}``, one per part; each part is
a tensor's bytes as they lie in memory, so nothing is ever unpickled. ``mac`` is HMAC-SHA256 of the
header under the pipeline's auth token: the token itself never travels, a peer without it cannot
forge a header, and a message for another pipeline fails the check. Tensor bytes are not covered
(hashing megabytes per hop costs more than the hop); see docs/pipeline.md for the threat model.

``EnvelopeCodec`` checks and builds that envelope and each part's description, leaving the parts as
bytes: the gateway's pipeline client, which sends and reads headers only, uses it as it is; the
stages' ``worker_runtime.frames.FrameCodec`` turns the parts into torch tensors and back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAX_HEADER_BYTES = 8 << 20
MAX_DIMS = 8  # the pipeline sends at most 2-d tensors; more is a malformed header
MAX_DIM = 1 << 40  # per dimension: far above any real tensor, far below torch's int64 overflow
DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4}  # bytes per element


class FrameError(ValueError):
    """A message that is not a well-formed, authenticated frame of this pipeline; it is dropped."""


@dataclass(frozen=True)
class RawPart:
    """One part of a received message as its header describes it: a dtype name, a shape and its bytes."""

    dtype: str
    shape: list[int]
    data: memoryview


class EnvelopeCodec:
    """Encodes and authenticates the envelopes of one pipeline (one token, one pipeline id)."""

    def __init__(self, pipeline_id: str, auth_token: str):
        self.pipeline_id = pipeline_id
        self._key = auth_token.encode()

    def _mac(self, header: bytes) -> bytes:
        return hmac.new(self._key, header, hashlib.sha256).digest()

    def encode_parts(self, header: dict[str, Any], specs: Sequence[dict[str, Any]] = (),
                     parts: Sequence[Any] = ()) -> list[Any]:
        """The parts of a message: ``header`` with this pipeline's id and ``specs`` (one
        ``{"dtype", "shape"}`` per part), then ``parts`` as they are."""
        body = json.dumps({**header, "pipeline_id": self.pipeline_id, "tensors": list(specs)}).encode()
        return [self._mac(body), body, *parts]

    def decode_parts(self, parts: list[Any]) -> tuple[dict[str, Any], list[RawPart]]:
        """Check and parse a received message: its header and its described parts; raises
        :class:`FrameError` saying what is wrong."""
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
        return header, [self._part(spec, part) for spec, part in zip(specs, parts[2:])]

    @staticmethod
    def _part(spec: Any, part: Any) -> RawPart:
        """The part, once its description is exactly ``{"dtype": name, "shape": [int, ...]}`` with sizes
        torch can take (a huge or fractional size must not reach torch: it raises there) and its bytes
        are as many as the description says."""
        dtype = spec.get("dtype") if isinstance(spec, dict) and isinstance(spec.get("dtype"), str) else None
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if (
            dtype not in DTYPE_SIZES
            or not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(type(d) is int and 0 <= d <= MAX_DIM for d in shape)
        ):
            raise FrameError(f"bad tensor description {spec!r}"[:300])
        buffer = memoryview(part)
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if buffer.nbytes != expected:
            raise FrameError(f"tensor part of {buffer.nbytes} bytes does not match {spec!r}"[:300])
        return RawPart(dtype, shape, buffer)
