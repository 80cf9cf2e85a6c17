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
class ProcessGroup:
    """Children started in their own process groups, so stopping one also stops its descendants."""

    children: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        process = subprocess.Popen(list(argv), env={**os.environ, **(env or {})}, start_new_session=True)
        self.children.append((name, process))
        return process

    def first_exit(self, poll_s: float = 0.5) -> tuple[str, int]:
        """Block until a child exits; return its name and exit code."""
        while True:
            for name, process in self.children:
                code = process.poll()
                if code is not None:
                    return name, code
            time.sleep(poll_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every child group, then SIGKILL what is still there after the grace period.

        Further SIGINT/SIGTERM are ignored from here on: a second Ctrl-C (or a supervisor's
        TERM after ours) must not interrupt the stopping and leave children behind.
        """
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _, process in self.children:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, process in self.children:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
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
