"""What `run_local` does when one of its children exits.

A control-plane process (the ASGI server, the Celery worker, beat) is the system: its exit stops
everything. A local agent is one node of the fleet: its exit is what motley is there to handle (the
node turns LOST once its heartbeats stop, and its stages are re-planned), so the control plane stays
up, the exit is reported, and the agent is started again only when asked (``--restart-agents``), after
a backoff that grows while it keeps failing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.ops.process_group import Child, ProcessGroup

# Restart delays of a crashing agent: doubled at each exit, capped; reset once it ran for STABLE_S.
BACKOFF_FIRST_S, BACKOFF_MAX_S, STABLE_S = 1.0, 30.0, 60.0


@dataclass
class Backoff:
    """The next restart delay per child name."""

    delays: dict[str, float] = field(default_factory=dict)

    def next_delay(self, child: Child, now: float) -> float:
        if now - child.started_at >= STABLE_S:
            self.delays.pop(child.name, None)
        delay = self.delays.get(child.name, BACKOFF_FIRST_S / 2) * 2
        self.delays[child.name] = min(delay, BACKOFF_MAX_S)
        return self.delays[child.name]


def agent_exit_message(child: Child, code: int, *, lost_after_s: float, restart_in_s: float | None) -> str:
    then = (f"restarting it in {restart_in_s:.0f}s (--restart-agents)" if restart_in_s is not None
            else "it is not restarted (pass --restart-agents to run_local for that)")
    return (f"{child.name} exited with code {code}; the control plane stays up: the node turns LOST after "
            f"{lost_after_s:.0f}s without its agent and its stages are re-planned on the other nodes; "
            f"{then}")


def supervise(
    group: ProcessGroup, *, restart_agents: bool, lost_after_s: float, report: Callable[[str], None]
) -> tuple[str, int]:
    """Watch the children until an essential one exits; return its name and exit code."""
    backoff, pending = Backoff(), []  # pending: (when, child) restarts
    while True:
        now = time.monotonic()
        for due in [p for p in pending if p[0] <= now]:
            pending.remove(due)
            group.restart(due[1])
            report(f"{due[1].name} restarted")
        wait = min((when for when, _ in pending), default=now + 3600) - now
        exited = group.next_exit(timeout_s=max(0.0, wait))
        if exited is None:
            continue
        child, code = exited
        if child.essential:
            return child.name, code
        delay = backoff.next_delay(child, time.monotonic()) if restart_agents else None
        report(agent_exit_message(child, code, lost_after_s=lost_after_s, restart_in_s=delay))
        group.forget(child)
        if delay is not None:
            pending.append((time.monotonic() + delay, child))
