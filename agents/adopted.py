"""A stage process the agent did not fork itself but adopted: the fork server's stages
(worker_runtime/fork_server.py) are forked twice so that they end up the agent's children.

The agent marks itself a child subreaper (PR_SET_CHILD_SUBREAPER): a descendant whose parent exits is
re-parented to it instead of to init, so it can wait for that stage and read its exit code exactly as
for a process it started with ``subprocess.Popen``. ``AdoptedProcess`` offers the part of Popen's
interface the supervisor uses (pid, stdin, stdout, poll, wait). A stage adopted this way gets its
PR_SET_PDEATHSIG once re-parented, so it dies with the agent's main thread (the process's life), where
a stage the agent forked dies with the supervisor's loop thread; both go when the agent is SIGKILLed.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
import time
from typing import IO

_PR_SET_CHILD_SUBREAPER = 36
_libc = ctypes.CDLL(None, use_errno=True)
_reapers = 0
_reapers_lock = threading.Lock()


def subreaper_acquire() -> bool:
    """Make this process a child subreaper (counted: each fork server holds it once); False where the
    kernel refuses, and the fork server is then not used."""
    global _reapers
    with _reapers_lock:
        if _reapers == 0 and _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return False
        _reapers += 1
        return True


def subreaper_release() -> None:
    """The last holder gone: orphans go to init again (a test process hosting a supervisor should not
    keep collecting the orphans of everything it starts later)."""
    global _reapers
    with _reapers_lock:
        _reapers -= 1
        if _reapers == 0:
            _libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


class AdoptedProcess:
    """A child process known by its pid (re-parented to this process), with its stdin and stdout."""

    def __init__(self, pid: int, stdin: IO[str] | None, stdout: IO[str]):
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def poll(self) -> int | None:
        """The exit code once it has ended (negative: the signal that killed it), else None."""
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:  # reaped elsewhere: gone, its code unknown
                    self.returncode = 255
                else:
                    if pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.005)
        return code
