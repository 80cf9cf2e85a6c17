"""What an agent says about one of its stages (docs/contracts.md §3 ``StageStatus``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from contracts.names import parse_pipeline_id
from contracts.stage_spec import StageSpec

StageState = Literal["starting", "ready", "draining", "exited", "failed"]


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
    # A head's only: the stage its pipeline lost (its ``health`` event), None while whole. Sent at once:
    # a stage's link breaking as its node's agent's socket closes says that agent died (liveness.py).
    broken_stage: int | None = None
    # The spec (``contracts.stage_spec.spec_digest`` of it as the control plane sent it) the report is
    # about: a process given a new spec in place keeps its pid, so the pid cannot tell old from new.
    spec_digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def identity_of(spec: StageSpec) -> tuple[int | None, int | None, int | None]:
    """(deployment_id, replica, stage_index) of a spec, the first two parsed from its ``pipeline_id``
    ("d7-r0" is deployment 7, replica 0; None, None for a pipeline id of another form)."""
    deployment, replica = parse_pipeline_id(spec.pipeline_id) or (None, None)
    return deployment, replica, spec.stage_index
