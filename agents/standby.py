"""The warm standbys: stage processes that have already imported Python and torch, one per device.

A new stage process spends most of its start importing (3-6 s on a loaded machine), and during an
in-place handover that is time without a completed request. So the supervisor keeps one
``worker_runtime.serve --standby`` waiting per device: it has imported everything, run a tiny stage
once, written ``warm`` in its folder, and blocks reading one line
on stdin, the path of a spec, then runs exactly as ``--spec PATH`` would (contracts §1). Starting a
stage hands it the path; the next standby starts once no stage of the agent is starting any more, so
its imports do not take CPU from the stages being loaded. Any standby serves any stage: threads and
device come from the spec.

A standby warms up under SCHED_IDLE where the agent can undo that (CAP_SYS_NICE, as root): it then
takes only CPU time nothing else wants; and in a cgroup of at most ``WARM_UP_CPUS`` CPUs where the
agent can make one (agents/cpu_quota.py), since SCHED_IDLE alone still let its imports double the
serving stages' latency on a 2-core host. Without it, the seconds of imports that follow every handover
(each agent whose standby became a stage starts the next one as soon as its stages are loaded, which
is when the new pipeline begins to serve or the resumed requests run) are taken from the stages
serving them wherever stages share CPUs, as emulated ones do. A standby is moved back to normal
scheduling when it is taken, or when it has not warmed up within ``IDLE_WARM_UP_S`` (a host whose CPUs
never idle would otherwise never get one).

Like a stage, a standby runs in its own session, dies with the supervisor's loop thread
(PR_SET_PDEATHSIG) and has a pid record, under ``stages/_standby/`` (``_standby-2/``… for the
others; no stage key starts with ``_``), so a restarted agent's sweep kills one that survived
anyway. Every method runs on the supervisor loop thread, the only one that forks.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from agents.cpu_quota import CpuQuota
from agents.processes import cpu_normal, signal_group, write_pid_record
from agents.stage_process import start_process
from contracts.names import STANDBY_WARM_FILE

log = logging.getLogger(__name__)

RETRY_S = 10.0  # after a standby died unused: do not spin on a command that cannot start
IDLE_WARM_UP_S = 20.0  # a standby still cold after this long under SCHED_IDLE is scheduled normally
WARM_UP_CPUS = 0.5  # the CPU the warming standbys of a host may take together (~4 s to warm up)


class Standby:
    """Up to ``count`` warm stage processes (the agent keeps one per device: an in-place handover
    restarts at most one stage a card, and each restart should find one warm). They are started one
    at a time, each once the one before has warmed up, so their imports never share the CPU."""

    def __init__(self, stages_dir: Path, command: Sequence[str], count: int = 1, idle: bool = False):
        """``idle``: warm up under SCHED_IDLE; only where the caller can undo it (``cpu_idle_reversible``)."""
        self._dirs = [stages_dir / ("_standby" if i == 0 else f"_standby-{i + 1}") for i in range(max(1, count))]
        self._command = [*command, "--standby"]
        self._popens: list[subprocess.Popen | None] = [None] * len(self._dirs)
        self._idle_until: list[float | None] = [None] * len(self._dirs)  # when an idle one turns normal
        self._idle = idle
        self._retry_at = 0.0
        self._quota = CpuQuota("motley-standby", WARM_UP_CPUS)

    def replenish(self, now: float, capped: bool = True) -> None:
        """Notice a standby that died unused (the next start spawns cold); start one more when none is
        still warming up and a place is free, held to ``WARM_UP_CPUS`` when ``capped`` (the agent's
        stages serve: an agent that serves nothing yet has no one to take the CPU from)."""
        for slot, popen in enumerate(self._popens):
            if popen is not None and (code := popen.poll()) is not None:
                log.warning("the standby stage process exited with code %s before use (see %s); retrying in "
                            "%.0f s", code, self._dirs[slot] / "stderr.log", RETRY_S)
                self._discard(slot)
                self._retry_at = now + RETRY_S
            elif (until := self._idle_until[slot]) is not None and (self._warm(slot) or now >= until):
                self._scheduled_normally(slot)
        if now < self._retry_at:
            return
        if any(popen is not None and not self._warm(slot) for slot, popen in enumerate(self._popens)):
            return
        slot = next((slot for slot, popen in enumerate(self._popens) if popen is None), None)
        if slot is None:
            return
        folder = self._dirs[slot]
        folder.mkdir(exist_ok=True, mode=0o700)
        (folder / STANDBY_WARM_FILE).unlink(missing_ok=True)  # a used or crashed standby's: not this one's
        try:
            self._popens[slot] = start_process(self._command, folder, subprocess.PIPE, idle=self._idle)
        except OSError as exc:
            log.warning("cannot start a standby stage process: %s", exc)
            self._retry_at = now + RETRY_S
            return
        self._idle_until[slot] = now + IDLE_WARM_UP_S if self._idle else None
        if capped:
            self._quota.add(self._popens[slot].pid)
        write_pid_record(folder / "pid.json", self._popens[slot].pid)

    def take(self, spec_path: Path) -> subprocess.Popen | None:
        """Hand a standby (a warm one first) a spec: it becomes that stage's process. None when no live
        standby waits; the caller then starts the stage the ordinary way."""
        waiting = [slot for slot, popen in enumerate(self._popens) if popen is not None]
        for slot in sorted(waiting, key=lambda slot: not self._warm(slot)):
            popen = self._popens[slot]
            assert popen is not None
            if popen.poll() is None:
                self._scheduled_normally(slot)  # before it has the spec: the stage must not run idle
                try:
                    assert popen.stdin is not None
                    popen.stdin.write(f"{spec_path}\n")
                    popen.stdin.flush()  # kept open: later specs go the same way (stage_process.respec)
                except OSError:  # it died between poll and write
                    pass
                else:
                    self._popens[slot] = None
                    (self._dirs[slot] / "pid.json").unlink(missing_ok=True)  # the caller records it as the stage's
                    return popen
            log.warning("a standby stage process died before use")
            self._discard(slot)
            self._retry_at = time.monotonic() + RETRY_S
        return None

    def close(self) -> None:
        """Kill the waiting standbys (the agent is stopping)."""
        for slot, popen in enumerate(self._popens):
            if popen is not None:
                self._discard(slot)
        self._quota.close()

    def _scheduled_normally(self, slot: int) -> None:
        """Warm, taken, or cold for too long: normal scheduling, out of the warm-up quota."""
        popen = self._popens[slot]
        if self._idle_until[slot] is not None and popen is not None:
            cpu_normal(popen.pid)
        if popen is not None:
            self._quota.remove(popen.pid)
        self._idle_until[slot] = None

    def _warm(self, slot: int) -> bool:
        return (self._dirs[slot] / STANDBY_WARM_FILE).exists()

    def _discard(self, slot: int) -> None:
        popen = self._popens[slot]
        assert popen is not None
        signal_group(popen.pid, signal.SIGKILL)
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("standby stage process %s did not die", popen.pid)
        for stream in (popen.stdin, popen.stdout):
            if stream is not None:
                stream.close()
        self._popens[slot] = None
        self._idle_until[slot] = None
        (self._dirs[slot] / "pid.json").unlink(missing_ok=True)
