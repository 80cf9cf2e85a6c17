"""What the supervisor knows of one stage: the spec as asked and as admitted, its process, its status."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agents.admission import Admitted
from agents.stage_process import StageRun
from contracts.stage_status import StageStatus


@dataclass
class StageRecord:
    key: str
    requested: tuple[dict[str, Any], int | None]  # spec and device index as sent (idempotence compares this)
    admitted: Admitted
    status: StageStatus
    run: StageRun | None = None
    crashes: int = 0  # consecutive
    restart_at: float | None = None
    kill_at: float | None = None
    stop_requested: bool = False
    waiters: list[Future] = field(default_factory=list)
    last_stats: tuple[float, dict[str, Any]] | None = None
    usage: tuple[float, float, float] = (0.0, 0.0, 0.0)  # of its device: busy fraction, tx/s, rx/s
    loads_idle_until: float | None = None  # while it loads lowered (load_priority.py): when restored anyway
    loading_digest: str | None = None  # the spec it was last handed as written: only its "ready" counts
    background: bool = False  # loads beside a serving pipeline: under the supervisor's CPU quota

    @property
    def alive(self) -> bool:
        return self.run is not None
