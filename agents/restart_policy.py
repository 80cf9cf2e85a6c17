"""How the supervisor restarts a crashed stage and how long it waits for a stopping one."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.stage_spec import StageSpec


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    backoff_s: float = 1.0  # first delay; doubles per consecutive crash
    max_backoff_s: float = 30.0
    stable_after_s: float = 60.0  # a run this long forgets earlier crashes
    stop_grace_s: float | None = None  # SIGTERM → SIGKILL; None: the spec's peer_timeout_s + 2 s

    def delay(self, crashes: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (crashes - 1))

    def grace(self, spec: StageSpec | None) -> float:
        if self.stop_grace_s is not None:
            return self.stop_grace_s
        return (spec.peer_timeout_s if spec is not None else StageSpec.peer_timeout_s) + 2.0
