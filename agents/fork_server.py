"""The agent's end of the stage fork server (worker_runtime/fork_server.py): one process per agent
that has imported Python and torch once and forks each stage process in milliseconds.

A new stage process spends most of its start importing (2-4 s of CPU), and during an in-place
handover that is time without a completed request. Once the server is warm (it has imported
everything, run a tiny stage once and written ``warm`` in its folder, ``stages/_fork_server/``), every
start of the default stage command is a fork of it: the agent hands it the stage's argv, folder and
two pipe ends (stdin, for new specs in place; stdout, for the events) and gets back the pid of a
process that is its own child (agents/adopted.py). While it is not warm, or gone, a start spawns the
ordinary way; a server that died is started again ``RETRY_S`` later.

The server warms up under SCHED_IDLE where the agent can undo that (CAP_SYS_NICE, as root), and in a
cgroup of at most ``WARM_UP_CPUS`` CPUs (agents/cpu_quota.py) while the agent's stages serve: a server
restarted after a crash must not take the serving stages' CPU for its imports. It is moved back to
normal scheduling and out of the quota once warm (or after ``IDLE_WARM_UP_S`` still cold under
SCHED_IDLE: a host whose CPUs never idle would otherwise never get one), before any fork, since a
forked stage inherits both. It runs in its own session, dies with the supervisor's loop thread
(PR_SET_PDEATHSIG) and has a pid record, so a restarted agent's sweep kills one that survived anyway.
Every method runs on the supervisor loop thread.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from agents.adopted import AdoptedProcess, subreaper_acquire, subreaper_release
from agents.cpu_quota import CpuQuota
from agents.processes import cpu_normal, signal_group, write_pid_record
from agents.stage_process import start_process
from contracts.names import FORK_SERVER_WARM_FILE

log = logging.getLogger(__name__)

RETRY_S = 10.0  # after the server died: do not spin on a command that cannot start
IDLE_WARM_UP_S = 20.0  # a server still cold after this long under SCHED_IDLE is scheduled normally
WARM_UP_CPUS = 0.5  # the CPU a warming server may take while its agent serves (~4 s to warm up)
REPLY_TIMEOUT_S = 10.0  # a fork takes milliseconds; a server that does not answer is replaced
FOLDER = "_fork_server"  # beside the stage folders; no stage key starts with "_"


class ForkServer:
    def __init__(self, stages_dir: Path, command: Sequence[str], idle: bool = False):
        """``command`` starts the server (``--socket-fd N`` is added); ``idle``: warm up under SCHED_IDLE,
        only where the caller can undo it (``cpu_idle_reversible``)."""
        self._dir = stages_dir / FOLDER
        self._command = list(command)
        self._popen: subprocess.Popen | None = None
        self._channel: socket.socket | None = None
        self._idle = idle
        self._idle_until: float | None = None  # when a server warming under SCHED_IDLE turns normal
        self._quota = CpuQuota("motley-fork-server", WARM_UP_CPUS)
        self._held = False  # idle or in the quota: not forked from until made normal
        self._retry_at = 0.0
        self._reaper = subreaper_acquire()
        if not self._reaper:
            log.warning("cannot become a child subreaper: every stage process starts cold (imports)")

    def replenish(self, now: float, capped: bool = True) -> None:
        """Notice a server that died (starts spawn cold meanwhile) and start one when there is none, held
        to ``WARM_UP_CPUS`` when ``capped`` (the agent's stages serve); a warm one leaves its quota."""
        if not self._reaper:
            return
        if self._popen is not None and (code := self._popen.poll()) is not None:
            log.warning("the stage fork server exited with code %s (see %s); retrying in %.0f s", code,
                        self._dir / "stderr.log", RETRY_S)
            self._discard()
            self._retry_at = now + RETRY_S
        elif self._held and (self._warm() or (self._idle_until is not None and now >= self._idle_until)):
            self._scheduled_normally()
        if self._popen is None and now >= self._retry_at:
            self._start(now, capped)

    def take(self, spec_path: Path) -> AdoptedProcess | None:
        """A stage process forked from the warm server running ``serve --spec SPEC_PATH --spec-inbox`` in
        the spec's folder; None when the server is not warm or fails (the caller spawns the ordinary
        way)."""
        if self._popen is None or self._channel is None or not self._warm() or self._popen.poll() is not None:
            return None
        self._scheduled_normally()  # before the fork: the stage inherits the server's scheduling
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        request = {"argv": ["--spec", str(spec_path), "--spec-inbox"], "cwd": str(spec_path.parent),
                   "reaper": os.getpid()}
        try:
            socket.send_fds(self._channel, [json.dumps(request).encode()], [stdin_read, stdout_write])
            reply = json.loads(self._channel.recv(1 << 16) or b"{}")
        except (OSError, ValueError) as exc:
            reply = {"error": f"the fork server did not answer: {exc}"}
        finally:
            os.close(stdin_read)
            os.close(stdout_write)
        if not isinstance(reply.get("pid"), int):
            log.warning("the stage fork server could not start %s: %s", spec_path.parent.name,
                        reply.get("error", "no answer"))
            os.close(stdin_write)
            os.close(stdout_read)
            self._discard()
            self._retry_at = time.monotonic() + RETRY_S
            return None
        return AdoptedProcess(reply["pid"], open(stdin_write, "w", encoding="utf-8"),
                              open(stdout_read, encoding="utf-8"))

    def close(self) -> None:
        """Kill the server (the agent is stopping); the stages it forked are the supervisor's."""
        if self._popen is not None:
            self._discard()
        self._quota.close()
        if self._reaper:
            subreaper_release()
            self._reaper = False

    def _start(self, now: float, capped: bool) -> None:
        self._dir.mkdir(exist_ok=True, mode=0o700)
        (self._dir / FORK_SERVER_WARM_FILE).unlink(missing_ok=True)  # a dead server's: not this one's
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._popen = start_process([*self._command, "--socket-fd", str(theirs.fileno())], self._dir,
                                        subprocess.DEVNULL, idle=self._idle, pass_fds=(theirs.fileno(),))
        except OSError as exc:
            log.warning("cannot start the stage fork server: %s", exc)
            ours.close()
            self._retry_at = now + RETRY_S
            return
        finally:
            theirs.close()
        ours.settimeout(REPLY_TIMEOUT_S)
        self._channel = ours
        self._idle_until = now + IDLE_WARM_UP_S if self._idle else None
        if capped:
            self._quota.add(self._popen.pid)
        self._held = capped or self._idle
        write_pid_record(self._dir / "pid.json", self._popen.pid)

    def _scheduled_normally(self) -> None:
        """Warm, or cold for too long: normal scheduling, out of the warm-up quota."""
        if self._popen is None or not self._held:
            return
        if self._idle_until is not None:
            cpu_normal(self._popen.pid)
            self._idle_until = None
        self._quota.remove(self._popen.pid)
        self._held = False

    def _warm(self) -> bool:
        return (self._dir / FORK_SERVER_WARM_FILE).exists()

    def _discard(self) -> None:
        assert self._popen is not None
        signal_group(self._popen.pid, signal.SIGKILL)
        try:
            self._popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("stage fork server %s did not die", self._popen.pid)
        if self._channel is not None:
            self._channel.close()
        self._popen, self._channel, self._idle_until, self._held = None, None, None, False
        (self._dir / "pid.json").unlink(missing_ok=True)
