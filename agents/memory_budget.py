"""The memory budget of an emulated device: a stage that would not fit on the real card is refused.

A CPU has far more memory than the GPU it stands in for, so nothing would ever fail to load; the
budget makes the emulated fleet refuse exactly the placements the real one could not hold. A stage's
bytes are what the planner counts for the real card (weights at the stage's precisions, a 16-bit KV
cache of ``kv_tokens``), computed from the checkpoint's config.json with the planner's own profiler.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contracts.hardware import GIB, DeviceSpec
from contracts.model_config import ModelConfig, UnsupportedModelError
from contracts.precision import layer_precisions
from contracts.profiler import profile_model

MIB = 1024**2


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
    """Bytes the stage would hold on the real card, from the checkpoint's config.json."""
    try:
        config = ModelConfig.from_file(Path(spec["model_path"]))
        first, last = (int(x) for x in spec["layers"])
        low_bits, low_from = (None if spec.get(k) is None else int(spec[k]) for k in ("low_bits", "low_from"))
        precisions = layer_precisions(first, last, int(spec.get("bits", 16)), low_bits, low_from)
        stage_index, num_stages = int(spec["stage_index"]), int(spec["num_stages"])
        kv_tokens = int(spec["kv_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StageRefused(f"cannot size the stage: spec is missing or has a bad field ({exc})") from None
    except UnsupportedModelError as exc:
        raise StageRefused(f"cannot size the stage: {exc}") from None
    profile = profile_model(config, name=str(spec["model_path"]))
    if not 0 <= first < last <= profile.num_layers:
        raise StageRefused(f"cannot size the stage: layers [{first}, {last}) of a "
                           f"{profile.num_layers}-layer model")
    layers = profile.layers[first:last]
    weights = sum(layer.weight_bytes[bits] for layer, bits in zip(layers, precisions))
    if stage_index == 0:
        weights += profile.embedding.weight_bytes[16]  # a lookup: the stage keeps it at 16 bits
    if stage_index == num_stages - 1:
        weights += profile.head.weight_bytes[precisions[-1]]
    kv = kv_tokens * sum(layer.kv_bytes_per_token for layer in layers)
    return StageBytes(weights, kv)


def check_fits(need: StageBytes, device: DeviceSpec, used_bytes: int) -> None:
    """Refuse a stage whose bytes exceed what the device has left after the stages it already runs."""
    free = device.memory_bytes - device.memory_used_bytes - used_bytes
    if need.total > free:
        raise StageRefused(
            f"does not fit on emulated {device.name} ({device.model}, {_size(device.memory_bytes)}): "
            f"needs {_size(need.total)} (weights {_size(need.weight_bytes)} + KV {_size(need.kv_bytes)}) "
            f"but {_size(max(free, 0))} is free"
        )


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"
