"""Start a set of child processes and stop them all together (the local launcher's supervisor)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Child:
    """One started process and how to start it again. ``essential``: the system cannot run without it
    (the control plane's processes), so its exit stops everything; an agent is not essential."""

    name: str
    argv: list[str]
    env: dict[str, str]
    essential: bool
    process: subprocess.Popen
    started_at: float


@dataclass
class ProcessGroup:
    """Children started in their own process groups, so stopping one also stops its descendants."""

    children: list[Child] = field(default_factory=list)

    def start(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, *, essential: bool = True
    ) -> Child:
        full_env = {**os.environ, **(env or {})}
        process = subprocess.Popen(list(argv), env=full_env, start_new_session=True)
        child = Child(name, list(argv), dict(env or {}), essential, process, time.monotonic())
        self.children.append(child)
        return child

    def restart(self, child: Child) -> Child:
        """Start a forgotten ``child`` again with the same command line and environment."""
        return self.start(child.name, child.argv, child.env, essential=child.essential)

    def forget(self, child: Child) -> None:
        """Stop watching an exited child; what is left of its process group (orphans) is killed."""
        _signal_group(child.process, signal.SIGKILL)
        self.children = [c for c in self.children if c is not child]

    def next_exit(self, timeout_s: float | None = None, poll_s: float = 0.5) -> tuple[Child, int] | None:
        """Block until a child exits (its record and exit code), or None after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            for child in self.children:
                code = child.process.poll()
                if code is not None:
                    return child, code
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic())))

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every child, then SIGKILL what is left of its group once it has exited or the grace
        period is over.

        Only the child itself is sent SIGTERM: it stops its own descendants in its own order. Signalled
        together with its pool processes, a Celery worker sees them die (logging each as an error) and
        its warm shutdown outlasts the grace period; signalled alone, it stops its pool and exits in
        about 7 s.

        Further SIGINT/SIGTERM are ignored from here on: a second Ctrl-C (or a supervisor's
        TERM after ours) must not interrupt the stopping and leave children behind.
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in self.children:
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for child in self.children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            _signal_group(child.process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def interrupt_once_on_signals() -> None:
    """Make Ctrl-C and SIGTERM stop the launcher by raising KeyboardInterrupt, once: the first
    signal also ignores any that follow, so nothing can interrupt the stopping of the children."""

    def _handler(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


def wait_for_port(host: str, port: int, timeout_s: float = 60.0) -> None:
    """Block until something accepts TCP connections on host:port."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout_s:.0f}s") from None
            time.sleep(0.2)


def python_argv(*args: str) -> list[str]:
    return [sys.executable, *args]
