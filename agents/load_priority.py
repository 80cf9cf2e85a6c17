"""How a loading stage yields the CPU to the stages that serve: SCHED_IDLE while it loads, and a CPU
quota when it loads beside a pipeline that serves.

Loading (reading, quantizing weights) is seconds of CPU, and stages that serve share the host's
CPUs with it, as emulated stages do. So a stage process loads under SCHED_IDLE where the agent can
undo that (``cpu_idle_reversible``) and is scheduled normally at ``ready``, or after
``LOAD_IDLE_S`` at the latest. SCHED_IDLE alone still let the loads of a new pipeline beside the
old one double the old one's latency on a 2-core host (docs/benchmarks.md, "Beside, session 10"), so
a start marked ``background`` (the control plane sends it for a pipeline started beside a serving
one and for a stage held ahead of an in-place handover, whose loads nobody waits for) also joins a
cgroup of at most ``BACKGROUND_LOAD_CPUS`` (agents/cpu_quota.py) until then. A stage loading inside
an in-place handover's pause is not background: the pause waits for it.
"""

from __future__ import annotations

import time

from agents.cpu_quota import CpuQuota
from agents.processes import cpu_idle, cpu_idle_reversible, cpu_normal

LOAD_IDLE_S = 10.0
BACKGROUND_LOAD_CPUS = 0.5


class LoadPriority:
    def __init__(self) -> None:
        self.idle = cpu_idle_reversible()
        self._quota = CpuQuota("motley-loading", BACKGROUND_LOAD_CPUS)

    def lowered(self, pid: int, background: bool) -> float | None:
        """Lower the stage process ``pid`` that starts loading; when to restore it at the latest (None:
        nothing was lowered)."""
        if self.idle:
            cpu_idle(pid)
        if background:
            self._quota.add(pid)
        return time.monotonic() + LOAD_IDLE_S if self.idle or background else None

    def restored(self, pid: int) -> None:
        """Loaded (or loading too long): scheduled normally, out of the quota."""
        if self.idle:
            cpu_normal(pid)
        self._quota.remove(pid)

    def close(self) -> None:
        self._quota.close()
