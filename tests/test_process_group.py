"""run_local's ProcessGroup.stop on plain processes: each child alone gets SIGTERM (it stops its own
descendants, as a Celery worker stops its pool), what is left of its process group is SIGKILLed once it
has exited, and a child that ignores SIGTERM is killed after the grace period."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import psutil

from controlplane.ops.process_group import ProcessGroup

# A process that records a SIGTERM in a file and then, unless told to stay, exits 0; "<file>.ready"
# says its handler is installed.
ON_TERM = """
import pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(sys.argv[1]).write_text("TERM")
    if sys.argv[2] == "exit":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(sys.argv[1] + ".ready").write_text("ready")
"""

# A leader that starts a grandchild in its own process group, then waits to be stopped.
LEADER = ON_TERM + """
import subprocess
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[3], sys.argv[4], "stay"])
pathlib.Path(sys.argv[5]).write_text(str(grandchild.pid))
while True:
    time.sleep(0.1)
"""

GRANDCHILD = ON_TERM + """
while True:
    time.sleep(0.1)
"""


def _wait_for(path: Path, timeout_s: float = 10) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.05)
    return path.read_text()


def test_stop_terms_each_child_alone_and_kills_what_is_left_of_its_group(tmp_path):
    group = ProcessGroup()
    leader, grandchild, pid_file = tmp_path / "leader", tmp_path / "grandchild", tmp_path / "pid"
    child = group.start("leader", [sys.executable, "-c", textwrap.dedent(LEADER), str(leader), "exit",
                                   textwrap.dedent(GRANDCHILD), str(grandchild), str(pid_file)])
    left_behind = psutil.Process(int(_wait_for(pid_file)))
    _wait_for(tmp_path / "grandchild.ready")
    try:
        group.stop(grace_s=10)

        assert child.process.returncode == 0 and leader.read_text() == "TERM"
        left_behind.wait(timeout=5)  # SIGKILLed with the leader's group: its handler never ran
        assert not grandchild.exists()
    finally:
        if left_behind.is_running():
            left_behind.kill()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace_period(tmp_path):
    group = ProcessGroup()
    stubborn = tmp_path / "stubborn"
    argv = [sys.executable, "-c", textwrap.dedent(GRANDCHILD), str(stubborn), "stay"]
    child = group.start("stubborn", argv)
    _wait_for(tmp_path / "stubborn.ready")

    group.stop(grace_s=0.5)

    assert stubborn.read_text() == "TERM"
    assert child.process.returncode == -9
