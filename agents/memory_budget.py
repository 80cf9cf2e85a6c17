"""The memory budget of an emulated device: a stage that would not fit on the real card is refused.

A CPU has far more memory than the GPU it stands in for, so nothing would ever fail to load; the
budget makes the emulated fleet refuse exactly the placements the real one could not hold. A stage's
bytes are its footprint (``contracts.footprint``: weights at the stage's precisions, a 16-bit KV
cache of ``kv_tokens``, the workspace of ``batch`` sequences), computed from the checkpoint's
config.json with the planner's own profiler; they must fit in the card's usable memory (free memory
less the same reserve the planner keeps) minus what the stages already admitted on it hold. The
planner sized the stage by the same formula against the same capacity, so a stage it placed is
never refused here, and one KV token more than it planned would be. Each rank of a tensor-parallel
stage is held to its own card by its share of the stage (``contracts.footprint.rank_footprint``),
the same bytes the planner's group fit counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from contracts.footprint import StageFootprint, rank_footprint, stage_footprint, usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.model_config import ModelConfig, UnsupportedModelError
from contracts.model_profile import ModelProfile
from contracts.profiler import profile_model
from contracts.stage_spec import StageSpec

MIB = 1024**2


class StageRefused(ValueError):
    """A stage the agent will not start; the message says why, for the operator."""


def spec_footprint(spec: StageSpec) -> StageFootprint:
    """The bytes the stage of a §1 spec would hold on the real card, from the checkpoint's config.json."""
    with _sizing():
        return stage_footprint(_profile(spec), *spec.layers, spec.precision, kv_tokens=spec.kv_tokens,
                               batch=spec.batch)


def rank_footprints(spec: StageSpec) -> list[StageFootprint]:
    """The bytes each rank of a tensor-parallel stage's group (``tensor_group``, in rank order) would hold
    on its real card: its share of the stage (``contracts.footprint.rank_footprint``)."""
    with _sizing():
        profile = _profile(spec)
        return [rank_footprint(profile, *spec.layers, spec.rank_spec(r).precision, kv_heads=rank.kv_heads,
                               intermediate=rank.intermediate, first=r == 0, kv_tokens=spec.kv_tokens,
                               batch=spec.batch)
                for r, rank in enumerate(spec.tensor_group)]


def _profile(spec: StageSpec) -> ModelProfile:
    return profile_model(ModelConfig.from_file(Path(spec.model_path)), name=spec.model_path)


@contextmanager
def _sizing() -> Iterator[None]:
    """A checkpoint or a stage that cannot be sized is refused, saying why."""
    try:
        yield
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
