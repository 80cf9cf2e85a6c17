"""What the agent says about one stage (contracts §3 ``StageStatus``) and about its load on a device."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

StageState = Literal["starting", "ready", "draining", "exited", "failed"]

_PIPELINE_ID = re.compile(r"^d(?P<deployment>\d+)-r(?P<replica>\d+)$")


@dataclass
class StageStatus:
    stage_key: str
    deployment_id: int | None
    replica: int | None
    stage_index: int | None
    state: StageState
    pid: int | None = None
    exit_code: int | None = None
    restarts: int = 0
    message: str = ""
    stats: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def identity_of(spec: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(deployment_id, replica, stage_index) of a spec: explicit keys win, else parsed from
    ``pipeline_id`` ("d7-r0" is deployment 7, replica 0)."""
    match = _PIPELINE_ID.match(str(spec.get("pipeline_id", "")))
    deployment = spec.get("deployment_id", int(match["deployment"]) if match else None)
    replica = spec.get("replica", int(match["replica"]) if match else None)
    return deployment, replica, spec.get("stage_index")


@dataclass(frozen=True)
class StageLoad:
    """How much of its device a stage occupies, for emulated device metrics."""

    device_index: int | None
    memory_bytes: int
    busy_fraction: float  # share of the last stats interval spent in steps
    tx_bytes_per_s: float
    rx_bytes_per_s: float
