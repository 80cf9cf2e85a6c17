"""A cap on the CPU a group of an agent's processes may take: a cgroup with a CFS quota.

Why not SCHED_IDLE alone: a stage loading beside a serving pipeline, or a warming process importing
Python and torch (the fork server restarted after a crash: agents/fork_server.py), takes seconds of
CPU; under SCHED_IDLE it takes only CPU time the serving stages leave, yet on a 2-core host it still
doubles their requests' latency for the 4-5 s it runs (reading and unpacking modules contends for the
caches and memory bandwidth a decode step lives on: `benchmarks/replacement_bench.py --room beside`,
docs/benchmarks.md "Live re-placement"). A quota bounds the share it can take at all; the work takes
longer, which costs nothing while nobody waits for it.

The group is made under the agent's own cgroup of the ``cpu`` controller: cgroup v1
(``/sys/fs/cgroup/cpu``), or v2 where that controller is delegated to the agent's cgroup. Where
neither can be written (no privileges, a container without cgroupfs), ``available`` is False and
every call does nothing: the processes run as they would without it.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

PERIOD_US = 100_000
_V1_ROOT = Path("/sys/fs/cgroup/cpu")
_V2_ROOT = Path("/sys/fs/cgroup")


class CpuQuota:
    def __init__(self, name: str, cpus: float):
        """A group named ``name`` whose processes together take at most ``cpus`` CPUs. The agents of one
        host share it (each sets the same quota): a host's warm-ups together are what is capped, and an
        agent killed before it could remove the group leaves one empty folder, not one per run."""
        self.available = False
        self._home: Path | None = None
        self._group: Path | None = None
        try:
            self._home, self._group = self._made(name, int(cpus * PERIOD_US))
            self.available = True
        except OSError as exc:
            log.info("no CPU quota for %s (%s): its processes run without one", name, exc)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads, and those it starts later) into the group."""
        if self._group is not None:
            self._move(pid, self._group)

    def remove(self, pid: int) -> None:
        """Move ``pid`` back to the agent's own cgroup: it runs without the cap again."""
        if self._home is not None:
            self._move(pid, self._home)

    def close(self) -> None:
        """Remove the group where nothing is in it any more (another agent's processes keep it)."""
        if self._group is not None:
            try:
                self._group.rmdir()
            except OSError:
                pass

    @staticmethod
    def _move(pid: int, group: Path) -> None:
        try:
            (group / "cgroup.procs").write_text(str(pid))
        except OSError:  # the process is gone, or the group was removed under us
            pass

    @staticmethod
    def _made(name: str, quota_us: int) -> tuple[Path, Path]:
        own = _own_cgroups()
        if _V1_ROOT.is_dir() and (path := own.get("cpu")) is not None:
            home = _V1_ROOT / path.lstrip("/")
            group = home / name
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            return home, group
        if (path := own.get("")) is not None:
            home = _V2_ROOT / path.lstrip("/")
            if "cpu" not in (home / "cgroup.subtree_control").read_text().split():
                raise OSError(f"the cpu controller is not delegated to {home}")
            group = home / name
            group.mkdir(exist_ok=True)
            (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
            return home, group
        raise OSError("no cgroup with the cpu controller")


def _own_cgroups() -> dict[str, str]:
    """Controller -> this process's cgroup path (v1 lines name their controllers; v2's is "")."""
    groups: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            groups[controller] = path
    return groups
