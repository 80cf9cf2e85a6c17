"""Operating-system plumbing for stage processes: dying with the agent, signalling groups, pid records.

Three mechanisms together keep "never leaves orphans" true:
- every stage runs in its own session (process group), so a signal reaches the stage's children too;
- PR_SET_PDEATHSIG makes the kernel SIGKILL a stage when the agent thread that forked it dies, even
  when the agent itself is SIGKILLed (hence all spawning happens on one long-lived thread; a stage
  forked by the fork server asks for it once adopted by the agent: agents/adopted.py);
- a pid record (pid + start time, so a recycled pid is never mistaken for ours) per running stage
  lets a restarted agent find and kill whatever survived anyway (another host-level accident).
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import psutil

from agents.files import replace_whole

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_CAP_SYS_NICE = 23
_libc = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: the child only makes the call


def die_with_parent(idle: bool = False) -> Callable[[], None]:
    """A ``preexec_fn`` that asks the kernel to SIGKILL the child when its parent goes away.

    It also closes the race where the parent dies between fork and prctl: the child then already
    has a different parent and exits at once instead of running unsupervised. ``idle``: the child
    starts under SCHED_IDLE (before exec, so every thread it ever makes inherits it), see
    :func:`cpu_idle_reversible`.
    """
    parent = os.getpid()

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        if idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    return preexec


def cpu_idle_reversible() -> bool:
    """Whether this process may move a child from SCHED_IDLE back to normal scheduling: Linux lets
    that only with CAP_SYS_NICE (root has it), so without it nothing is ever made idle."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return False
    caps = next((line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), "0")
    return bool(int(caps, 16) >> _CAP_SYS_NICE & 1)


def cpu_normal(pid: int) -> None:
    """Every thread of ``pid`` back to normal scheduling (SCHED_OTHER), the main thread first so the
    threads it starts from now on inherit that; a thread or process that is gone is fine."""
    _schedule_threads(pid, os.SCHED_OTHER)


def cpu_idle(pid: int) -> None:
    """Every thread of ``pid`` (and those it starts later) under SCHED_IDLE: it runs only on CPU time
    nothing else wants. Undo with :func:`cpu_normal`, which needs :func:`cpu_idle_reversible`."""
    _schedule_threads(pid, os.SCHED_IDLE)


def _schedule_threads(pid: int, policy: int) -> None:
    try:
        tids = sorted(map(int, os.listdir(f"/proc/{pid}/task")), key=lambda tid: tid != pid)
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pid: int, sig: int) -> None:
    """Signal a stage's whole process group (its pid leads the group); a vanished group is fine."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def write_pid_record(path: Path, pid: int) -> None:
    try:
        started = psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return
    replace_whole(path, json.dumps({"pid": pid, "create_time": started}))


def sweep_pid_records(paths: list[Path], grace_s: float = 2.0) -> list[int]:
    """Kill the process groups of recorded stages that still run; remove the records. Returns pids."""
    survivors: list[psutil.Process] = []
    for path in paths:
        process = _recorded_process(path)
        path.unlink(missing_ok=True)
        if process is not None:
            log.warning("killing leftover stage process %s (%s) from a previous agent run",
                        process.pid, path.parent.name)
            signal_group(process.pid, signal.SIGTERM)
            survivors.append(process)
    _, alive = psutil.wait_procs(survivors, timeout=grace_s)
    for process in alive:
        signal_group(process.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=grace_s)
    return [p.pid for p in survivors]


def _recorded_process(path: Path) -> psutil.Process | None:
    try:
        record = json.loads(path.read_text())
        process = psutil.Process(int(record["pid"]))
        if process.status() == psutil.STATUS_ZOMBIE:
            return None  # already dead (PDEATHSIG did its job), only not yet reaped by init
        # create_time is rounded differently across calls on some kernels: allow a little slack.
        if abs(process.create_time() - float(record["create_time"])) > 0.05:
            return None
        return process
    except (OSError, ValueError, KeyError, TypeError, psutil.Error):
        return None
