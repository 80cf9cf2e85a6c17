"""The memory budget of an emulated device: a stage that would not fit on the real card is refused.

A CPU has far more memory than the GPU it stands in for, so nothing would ever fail to load; the
budget makes the emulated fleet refuse exactly the placements the real one could not hold. A stage's
bytes are what the planner counts for the real card (weights at the stage's precision, a 16-bit KV
cache of ``kv_tokens``), taken from the spec's ``memory`` block when the control plane sends one, or
computed from the checkpoint's config.json with the planner's own profiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.hardware.specs import GIB, DeviceSpec
from controlplane.modelspec.profiler import profile_model
from worker_runtime.config import ModelConfig, UnsupportedModelError


class StageRefused(ValueError):
    """A stage the agent will not start; the message says why, for the operator."""


@dataclass(frozen=True)
class StageBytes:
    weight_bytes: int
    kv_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.kv_bytes


def stage_bytes(spec: dict[str, Any]) -> StageBytes:
    """Bytes the stage holds on its device: the spec's ``memory`` block, else from config.json."""
    declared = spec.get("memory")
    if isinstance(declared, dict):
        try:
            return StageBytes(int(declared["weight_bytes"]), int(declared["kv_bytes"]))
        except (KeyError, TypeError, ValueError):
            raise StageRefused("spec.memory: expected integers weight_bytes and kv_bytes") from None
    try:
        config = ModelConfig.from_file(Path(spec["model_path"]))
        first, last = (int(x) for x in spec["layers"])
        bits = int(spec.get("bits", 16))
        stage_index, num_stages = int(spec["stage_index"]), int(spec["num_stages"])
        kv_tokens = int(spec["kv_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StageRefused(f"cannot size the stage: spec is missing or has a bad field ({exc})") from None
    except UnsupportedModelError as exc:
        raise StageRefused(f"cannot size the stage: {exc}") from None
    profile = profile_model(config, name=str(spec["model_path"]))
    if bits not in profile.embedding.weight_bytes or not 0 <= first < last <= profile.num_layers:
        raise StageRefused(f"cannot size the stage: bits={bits}, layers=[{first}, {last}) "
                           f"of a {profile.num_layers}-layer model")
    layers = profile.layers[first:last]
    weights = sum(layer.weight_bytes[bits] for layer in layers)
    if stage_index == 0:
        weights += profile.embedding.weight_bytes[bits]
    if stage_index == num_stages - 1:
        weights += profile.head.weight_bytes[bits]
    kv = kv_tokens * sum(layer.kv_bytes_per_token for layer in layers)
    return StageBytes(weights, kv)


def check_fits(need: StageBytes, device: DeviceSpec, used_bytes: int) -> None:
    """Refuse a stage whose bytes exceed what the device has left after the stages it already runs."""
    free = device.memory_bytes - device.memory_used_bytes - used_bytes
    if need.total > free:
        raise StageRefused(
            f"does not fit on emulated {device.name} ({device.model}, {device.memory_bytes / GIB:.1f} GiB): "
            f"needs {need.total / GIB:.2f} GiB (weights {need.weight_bytes / GIB:.2f} GiB + "
            f"KV {need.kv_bytes / GIB:.2f} GiB) but {max(free, 0) / GIB:.2f} GiB is free"
        )
