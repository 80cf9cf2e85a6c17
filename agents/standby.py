"""The warm standby: one stage process per agent that has already imported Python and torch.

A new stage process spends most of its start importing (3-6 s on a loaded machine), and during an
in-place handover that is time without a completed request. So the supervisor keeps one
``worker_runtime.serve --standby`` waiting: it has imported everything and blocks reading one line
on stdin, the path of a spec, then runs exactly as ``--spec PATH`` would (contracts §1). Starting a
stage hands it the path; the next standby starts once no stage of the agent is starting any more, so
its imports do not take CPU from the stages being loaded. One standby serves any stage: threads and
device come from the spec.

Like a stage, the standby runs in its own session, dies with the supervisor's loop thread
(PR_SET_PDEATHSIG) and has a pid record, under ``stages/_standby/`` (no stage key starts with ``_``),
so a restarted agent's sweep kills one that survived anyway. Every method runs on the supervisor
loop thread, the only one that forks.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from agents.processes import signal_group, write_pid_record
from agents.stage_process import start_process

log = logging.getLogger(__name__)

RETRY_S = 10.0  # after a standby died unused: do not spin on a command that cannot start


class Standby:
    def __init__(self, stages_dir: Path, command: Sequence[str]):
        self._dir = stages_dir / "_standby"
        self._command = [*command, "--standby"]
        self._popen: subprocess.Popen | None = None
        self._retry_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def replenish(self, now: float) -> None:
        """Start a standby if none waits; notice one that died unused (the next start spawns cold)."""
        if self._popen is not None:
            code = self._popen.poll()
            if code is None:
                return
            log.warning("the standby stage process exited with code %s before use (see %s); retrying in %.0f s",
                        code, self._dir / "stderr.log", RETRY_S)
            self._discard()
            self._retry_at = now + RETRY_S
            return
        if now < self._retry_at:
            return
        self._dir.mkdir(exist_ok=True, mode=0o700)
        try:
            self._popen = start_process(self._command, self._dir, subprocess.PIPE)
        except OSError as exc:
            log.warning("cannot start a standby stage process: %s", exc)
            self._retry_at = now + RETRY_S
            return
        write_pid_record(self._dir / "pid.json", self._popen.pid)

    def take(self, spec_path: Path) -> subprocess.Popen | None:
        """Hand the standby a spec: it becomes that stage's process. None when no live standby
        waits; the caller then starts the stage the ordinary way."""
        popen = self._popen
        if popen is None:
            return None
        if popen.poll() is None:
            try:
                assert popen.stdin is not None
                popen.stdin.write(f"{spec_path}\n")
                popen.stdin.close()
            except OSError:  # it died between poll and write
                pass
            else:
                self._popen = None
                (self._dir / "pid.json").unlink(missing_ok=True)  # the caller records it as the stage's
                return popen
        log.warning("the standby stage process died before use; starting the stage the ordinary way")
        self._discard()
        self._retry_at = time.monotonic() + RETRY_S
        return None

    def close(self) -> None:
        """Kill the waiting standby (the agent is stopping)."""
        if self._popen is not None:
            self._discard()

    def _discard(self) -> None:
        assert self._popen is not None
        signal_group(self._popen.pid, signal.SIGKILL)
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("standby stage process %s did not die", self._popen.pid)
        for stream in (self._popen.stdin, self._popen.stdout):
            if stream is not None:
                stream.close()
        self._popen = None
        (self._dir / "pid.json").unlink(missing_ok=True)
