"""How a loading stage yields the CPU to the stages that serve, when nobody waits for its load:
SCHED_IDLE and a CPU quota while it loads beside a pipeline that serves.

Loading (reading, quantizing weights) is seconds of CPU, and stages that serve share the host's
CPUs with it, as emulated stages do. SCHED_IDLE alone still lets the loads of a new pipeline beside the
old one double the old one's latency on a 2-core host (`benchmarks/replacement_bench.py --room beside`), so
a start marked ``background`` (the control plane sends it for a pipeline started beside a serving
one and for a stage held ahead of an in-place handover, whose loads nobody waits for) loads under
SCHED_IDLE where the agent can undo that (``cpu_idle_reversible``) and in a cgroup of at most
``BACKGROUND_LOAD_CPUS`` (agents/cpu_quota.py), until ``ready`` or ``LOAD_IDLE_S`` at the latest.
Every other start is waited for (an in-place handover's pause, a lost node's replacement, a first
deploy, a crash's restart) and is not lowered: under SCHED_IDLE the replacement of a kill -9'd
stage, a 0.15 s load alone, takes 0.6 s among the control plane's and the gateway's work of that
moment (`benchmarks/replacement_bench.py --room in-place`, docs/benchmarks.md "Live re-placement").
"""

from __future__ import annotations

import time

from agents.cpu_quota import CpuQuota
from agents.processes import cpu_idle, cpu_idle_reversible, cpu_normal

LOAD_IDLE_S = 10.0
BACKGROUND_LOAD_CPUS = 0.2


class LoadPriority:
    def __init__(self) -> None:
        self.idle = cpu_idle_reversible()
        self._quota = CpuQuota("motley-loading", BACKGROUND_LOAD_CPUS)

    def lowered(self, pid: int, background: bool) -> float | None:
        """Lower the stage process ``pid`` that starts loading when nobody waits for it (``background``);
        when to restore it at the latest (None: nothing was lowered)."""
        if not background:
            return None
        if self.idle:
            cpu_idle(pid)
        self._quota.add(pid)
        return time.monotonic() + LOAD_IDLE_S

    def restored(self, pid: int) -> None:
        """Loaded (or loading too long): scheduled normally, out of the quota."""
        if self.idle:
            cpu_normal(pid)
        self._quota.remove(pid)

    def close(self) -> None:
        self._quota.close()
