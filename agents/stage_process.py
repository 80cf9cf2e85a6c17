"""One stage's operating-system process: how it is started, how its stdout is read, how its end is told.

The supervisor decides *when* a stage runs (admission, restarts, stops); this module knows *how* one
run of it looks from the outside (contracts §1): the spec written to a private file, the process
started in its own session with PDEATHSIG and a pid record, one JSON object per stdout line read on
a thread of its own, stderr kept in a log whose last line explains a crash that sent no ``error``
event, and the busy fraction and transfer rates worked out from two ``stats`` lines.

Nothing here keeps state across runs or takes a lock: the supervisor loop, the only caller, owns
every stage record and makes every fork (see agents/supervisor.py for why the forking thread matters).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.adopted import AdoptedProcess
from agents.files import replace_whole
from agents.processes import die_with_parent, signal_group, write_pid_record
from contracts.names import WEIGHT_CACHE_ENV

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Beside the stage folders (every stage runs in stages/<key>/), named so no stage key can be it.
WEIGHT_CACHE_DIR = "_weights"
DEFAULT_COMMAND = (sys.executable, "-m", "worker_runtime.serve")
FORK_SERVER_COMMAND = (sys.executable, "-m", "worker_runtime.fork_server")  # forks DEFAULT_COMMAND's stages

# Called on the reader thread with each JSON object the stage prints, and the time it was read.
OnMessage = Callable[["StageRun", dict[str, Any], float], None]


@dataclass
class StageRun:
    """One process of a stage."""

    popen: subprocess.Popen | AdoptedProcess
    started: float
    reader: threading.Thread | None = None
    last_error: str = ""  # the stage's last {"event": "error"} message, set by the reader thread

    @property
    def pid(self) -> int:
        return self.popen.pid


class SpawnFailed(Exception):
    """The stage's process could not be started (no such command, no permission, out of processes)."""


def spawn(command: Sequence[str], stage_dir: Path, spec: dict[str, Any], on_message: OnMessage,
          fork: Callable[[Path], AdoptedProcess | None] | None = None, inbox: bool = False) -> StageRun:
    """Write the spec and run it: forked by ``fork`` (the fork server, agents/fork_server.py) when it
    can, else ``command --spec SPEC`` started in ``stage_dir``; its stdout goes to ``on_message`` line
    by line. ``inbox``: the process takes new specs on stdin (``respec``), as a forked one always does.
    Raises SpawnFailed when the process cannot be started."""
    stage_dir.mkdir(exist_ok=True, mode=0o700)
    spec_path = _spec_write(stage_dir, spec)
    popen = fork(spec_path) if fork is not None else None
    if popen is None:
        argv = [*command, "--spec", str(spec_path), *(["--spec-inbox"] if inbox else [])]
        try:
            popen = start_process(argv, stage_dir, subprocess.PIPE if inbox else subprocess.DEVNULL)
        except OSError as exc:
            raise SpawnFailed(f"cannot start the stage process: {exc}") from exc
    write_pid_record(stage_dir / "pid.json", popen.pid)
    run = StageRun(popen, time.monotonic())
    run.reader = threading.Thread(target=_read_stdout, args=(stage_dir.name, run, on_message), daemon=True,
                                  name=f"stage-{stage_dir.name}-stdout")
    run.reader.start()
    return run


def respec(run: StageRun, stage_dir: Path, spec: dict[str, Any]) -> bool:
    """Hand the running process a new spec in place (worker_runtime/spec_inbox.py); False when it cannot
    be told (no stdin to it, or it is exiting): then it must be replaced the ordinary way."""
    stdin = run.popen.stdin
    if stdin is None or run.popen.poll() is not None:
        return False
    try:
        stdin.write(f"{_spec_write(stage_dir, spec)}\n")
        stdin.flush()
    except (OSError, ValueError):  # a broken pipe, or a stream closed as it exited
        return False
    return True


def _spec_write(stage_dir: Path, spec: dict[str, Any]) -> Path:
    """The spec as the process reads it, replaced whole (a process reading it never sees half a file)."""
    spec_path = stage_dir / "spec.json"
    replace_whole(spec_path, json.dumps(spec, indent=1), mode=0o600)  # 0600: it carries the auth_token
    return spec_path


def start_process(argv: list[str], cwd: Path, stdin: int, idle: bool = False,
                  pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """A stage process as contracts §1 wants it, wherever it is started from: its own session, killed
    with the agent's loop thread, stdout a pipe of JSON lines, stderr appended to ``cwd/stderr.log``;
    ``idle``: under SCHED_IDLE (the fork server warming up, agents/fork_server.py); ``pass_fds``: kept
    open in it (the fork server's socket)."""
    with open(cwd / "stderr.log", "ab") as stderr:
        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent(idle),
            pass_fds=pass_fds,
            env=_stage_env(cwd.parent / WEIGHT_CACHE_DIR),
            cwd=cwd,
        )


def reap(run: StageRun, stage_dir: Path) -> None:
    """After the process exited: kill what it left in its group, let the reader take the last lines,
    drop the pid record."""
    signal_group(run.pid, signal.SIGKILL)
    if run.popen.stdin is not None:
        try:
            run.popen.stdin.close()
        except OSError:  # what was buffered for a process that is gone
            pass
    if run.reader is not None:
        run.reader.join(timeout=0.5)  # so a last {"event": "error"} is read
    (stage_dir / "pid.json").unlink(missing_ok=True)


def crash_reason(run: StageRun, code: int, stage_dir: Path) -> str:
    """How the process ended and why: its last ``error`` event, else the last line of its stderr."""
    return f"{_describe_exit(code)}: {run.last_error or _stderr_tail(stage_dir)}"


def usage_between(
    t0: float, before: dict[str, Any], t1: float, after: dict[str, Any]
) -> tuple[float, float, float]:
    """Busy fraction and transfer rates of a stage between two stats lines."""
    elapsed = t1 - t0
    if elapsed <= 0:
        return 0.0, 0.0, 0.0

    def delta(name: str) -> float:
        try:
            return max(0.0, float(after.get(name, 0)) - float(before.get(name, 0)))
        except (TypeError, ValueError):
            return 0.0

    try:
        step_s = float(after.get("step_ms", 0)) / 1000.0
    except (TypeError, ValueError):
        step_s = 0.0
    busy = min(1.0, delta("steps") * step_s / elapsed)
    return busy, delta("bytes_sent") / elapsed, delta("bytes_received") / elapsed


def _read_stdout(key: str, run: StageRun, on_message: OnMessage) -> None:
    """Reader thread: one JSON object per line (contracts §1); anything else is logged and skipped."""
    assert run.popen.stdout is not None
    for line in run.popen.stdout:
        line = line.strip()
        if not line:
            continue
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            log.warning("stage %s wrote a non-JSON line to stdout: %.200s", key, line)
            continue
        if not isinstance(message, dict):
            continue
        if message.get("event") == "error":
            run.last_error = str(message.get("message", ""))
        on_message(run, message, time.monotonic())
    run.popen.stdout.close()


def _stage_env(weight_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[WEIGHT_CACHE_ENV] = str(weight_cache)  # quantized layers kept for the next stage (weight_cache.py)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"  # one stdout line per event, as it happens
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # cuda:N is NVML's device N
    return env


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def _stderr_tail(stage_dir: Path) -> str:
    try:
        with open(stage_dir / "stderr.log", "rb") as stderr:
            stderr.seek(0, os.SEEK_END)
            stderr.seek(max(0, stderr.tell() - 2000))
            lines = [line for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no error message"
    return lines[-1].strip() if lines else "no error message"
