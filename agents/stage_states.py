"""A stage's states and the moves between them (contracts §3); the supervisor decides when, these say how.

``starting``: spawned, given a new spec in place, or waiting out a restart backoff after a crash (with
``exit_code`` and ``message`` saying so). ``ready``: loaded and serving. ``draining``: told to stop
(SIGTERM, or SIGUSR1 for a stage replaced by a new spec). ``exited``: stopped on request, or exited on
its own with code 0. ``failed``: refused, not spawned, or crashed more than the restart limit.
``exited`` and ``failed`` are final: a start afterwards makes a new record. A stage stopped on request
is forgotten once it has exited; a failed or self-exited one stays listed so the control plane sees it
in every heartbeat until it stops, syncs or restarts it.
"""

from __future__ import annotations

from collections.abc import Callable

from agents.restart_policy import RestartPolicy
from agents.stage_record import StageRecord
from contracts.stage_status import StageState, StageStatus

# Every move the supervisor makes; a move not listed is a bug in it, raised as IllegalMove.
MOVES: dict[StageState, frozenset[StageState]] = {
    "starting": frozenset({"starting", "ready", "draining", "exited", "failed"}),
    "ready": frozenset({"starting", "draining", "exited", "failed"}),
    "draining": frozenset({"draining", "exited"}),
    "exited": frozenset({"exited"}),
    "failed": frozenset({"failed"}),
}


class IllegalMove(RuntimeError):
    """The supervisor moved a stage in a way ``MOVES`` does not allow."""


def _move(status: StageStatus, state: StageState, message: str | None = None) -> None:
    if state not in MOVES[status.state]:
        raise IllegalMove(f"stage {status.stage_key}: {status.state} -> {state}")
    status.state = state
    if message is not None:
        status.message = message


def spawned(status: StageStatus, pid: int) -> None:
    """A process of the stage started (first, or restarted after a crash: the crash's message stays)."""
    _move(status, "starting")
    status.pid, status.broken_stage = pid, None


def respecced(status: StageStatus, spec_digest: str) -> None:
    """The running process took a new spec in place: it loads again, and says ready for that spec."""
    _move(status, "starting", "")
    status.broken_stage, status.spec_digest = None, spec_digest


def ready(status: StageStatus) -> bool:
    """The process said ``ready``: a starting stage serves now. False in any other state (a late
    ``ready`` of a stage told to stop meanwhile changes nothing)."""
    if status.state != "starting":
        return False
    _move(status, "ready", "")
    return True


def failed(status: StageStatus, message: str) -> None:
    """Refused by admission, or its process could not be spawned."""
    _move(status, "failed", message)


def draining(status: StageStatus) -> None:
    """Told to stop: a signal went to its process."""
    _move(status, "draining")


def stopped_without_process(status: StageStatus) -> None:
    """A stop of a stage with no process (failed, exited or waiting out a backoff): exited, unless it
    failed, which it stays, with the message saying why."""
    _move(status, "failed" if status.state == "failed" else "exited")
    status.message = status.message or "stopped on request"


def process_exited(stage: StageRecord, code: int, policy: RestartPolicy, now: float,
                   why: Callable[[], str]) -> None:
    """Its process exited with ``code``: exited when told to stop or with code 0; a crash (``why()``
    says how it ended) starts again after the policy's backoff (``stage.restart_at``), or fails once
    the stage crashed ``policy.max_restarts`` times in a row."""
    status = stage.status
    status.pid, status.exit_code = None, code
    if stage.stop_requested:
        _move(status, "exited", "stopped on request")
    elif code == 0:
        _move(status, "exited", "exited on its own with code 0")
    elif stage.crashes >= policy.max_restarts:
        _move(status, "failed", f"{why()}; gave up after {status.restarts} restarts")
    else:
        stage.crashes += 1
        status.restarts += 1
        delay = policy.delay(stage.crashes)
        stage.restart_at = now + delay
        _move(status, "starting", f"{why()}; restart {stage.crashes}/{policy.max_restarts} in {delay:.1f} s")
