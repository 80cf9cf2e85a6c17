"""The memory budget of an emulated device: a stage that would not fit on the real card is refused.

A CPU has far more memory than the GPU it stands in for, so nothing would ever fail to load; the
budget makes the emulated fleet refuse exactly the placements the real one could not hold. A stage's
bytes are its footprint (``contracts.footprint``: weights at the stage's precisions, a 16-bit KV
cache of ``kv_tokens``, the workspace of ``batch`` sequences), computed from the checkpoint's
config.json with the planner's own profiler; they must fit in the card's usable memory (free memory
less the same reserve the planner keeps) minus what the stages already admitted on it hold. The
planner sized the stage by the same formula against the same capacity, so a stage it placed is
never refused here, and one KV token more than it planned would be.
"""

from __future__ import annotations

from pathlib import Path

from contracts.footprint import StageFootprint, stage_footprint, usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_config import ModelConfig, UnsupportedModelError
from contracts.profiler import profile_model
from contracts.stage_spec import StageSpec

MIB = 1024**2


class StageRefused(ValueError):
    """A stage the agent will not start; the message says why, for the operator."""


def spec_footprint(spec: StageSpec) -> StageFootprint:
    """The bytes the stage of a §1 spec would hold on the real card, from the checkpoint's config.json."""
    try:
        config = ModelConfig.from_file(Path(spec.model_path))
        profile = profile_model(config, name=spec.model_path)
        return stage_footprint(profile, *spec.layers, spec.precision, kv_tokens=spec.kv_tokens,
                               batch=spec.batch)
    except UnsupportedModelError as exc:
        raise StageRefused(f"cannot size the stage: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise StageRefused(f"cannot size the stage: its model or layers do not fit ({exc})") from None


def check_fits(need: StageFootprint, device: DeviceSpec, used_bytes: int) -> None:
    """Refuse a stage whose footprint exceeds the device's usable memory less what the stages it
    already runs hold (``used_bytes``)."""
    usable = usable_bytes(device)
    room = usable - used_bytes
    if need.total_bytes > room:
        raise StageRefused(
            f"does not fit on emulated {device.name} ({device.model}, {_size(device.memory_bytes)}): "
            f"needs {_size(need.total_bytes)} (weights {_size(need.weights_bytes)} + KV "
            f"{_size(need.kv_bytes)} + workspace {_size(need.workspace_bytes)}) but {_size(max(room, 0))} is "
            f"usable ({_size(max(usable, 0))} after the reserve, {_size(used_bytes)} held by other stages)"
        )


def _size(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"
