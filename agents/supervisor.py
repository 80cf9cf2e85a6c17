"""Stage processes: start them from a spec file, follow their stdout, restart crashes, stop them.

One thread (the supervisor loop) owns every stage record and makes every fork. That is not only
tidy locking: PR_SET_PDEATHSIG fires when the *thread* that forked a child exits, so spawning from
short-lived threads (a Celery task, a timer) would kill stages at random. Other threads talk to the
loop through its inbox and wait on futures. The loop polls exits every 0.1 s, so an exit is reported
well within the 2 s the protocol promises.

States follow contracts §3: ``starting`` (spawned, or waiting out a restart backoff after a crash,
with ``exit_code`` and ``message`` saying so), ``ready``, ``draining`` (SIGTERM sent), ``exited``
(stopped on request or exit code 0), ``failed`` (refused, or crashed more than the restart limit).
A stage stopped on request is forgotten once it has exited; a failed or self-exited one stays listed
so the control plane sees it in every heartbeat until it stops, syncs or restarts it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.admission import Admission, Admitted
from agents.memory_budget import StageRefused
from agents.processes import die_with_parent, signal_group, sweep_pid_records, write_pid_record
from agents.stage_load import StageLoad
from contracts.stage_status import StageStatus, identity_of

log = logging.getLogger(__name__)

POLL_S = 0.1
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_COMMAND = (sys.executable, "-m", "worker_runtime.serve")
_STAGE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SupervisorClosed(RuntimeError):
    """The agent is shutting down: no stage is started, stopped or listed any more."""


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    backoff_s: float = 1.0  # first delay; doubles per consecutive crash
    max_backoff_s: float = 30.0
    stable_after_s: float = 60.0  # a run this long forgets earlier crashes
    stop_grace_s: float | None = None  # SIGTERM → SIGKILL; None: the spec's peer_timeout_s + 2 s

    def delay(self, crashes: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** (crashes - 1))

    def grace(self, spec: dict[str, Any]) -> float:
        if self.stop_grace_s is not None:
            return self.stop_grace_s
        return float(spec.get("peer_timeout_s", 5.0)) + 2.0


@dataclass
class _Run:
    """One process of a stage."""

    popen: subprocess.Popen
    started: float
    reader: threading.Thread | None = None
    last_error: str = ""  # the stage's last {"event": "error"} message, set by the reader thread


@dataclass
class _Stage:
    key: str
    requested: tuple[dict[str, Any], int | None]  # spec and device index as sent (idempotence compares this)
    admitted: Admitted
    status: StageStatus
    run: _Run | None = None
    crashes: int = 0  # consecutive
    restart_at: float | None = None
    kill_at: float | None = None
    stop_requested: bool = False
    waiters: list[Future] = field(default_factory=list)
    last_stats: tuple[float, dict[str, Any]] | None = None
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)  # busy fraction, tx/s, rx/s

    @property
    def alive(self) -> bool:
        return self.run is not None


class Supervisor:
    def __init__(
        self,
        state_dir: Path,
        admission: Admission,
        on_event: Callable[[StageStatus], None],
        command: Sequence[str] = DEFAULT_COMMAND,
        policy: RestartPolicy = RestartPolicy(),
    ):
        self._dir = Path(state_dir) / "stages"
        self._dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # specs carry the pipeline's auth_token
        self._admission = admission
        self._on_event = on_event
        self._command = list(command)
        self._policy = policy
        self._stages: dict[str, _Stage] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._closing = threading.Lock()  # orders "closed?" + put against "close" + drain
        self.swept_pids = sweep_pid_records(sorted(self._dir.glob("*/pid.json")))
        self._thread = threading.Thread(target=self._loop, name="stage-supervisor", daemon=True)
        self._thread.start()

    # --- interface for other threads -------------------------------------------------------------

    def start(self, stage_key: str, spec: dict[str, Any], device_index: int | None = None) -> StageStatus:
        """Run the spec under this key. The same spec again changes nothing; a different one (or a
        start while the stage drains) stops the running process first."""
        if not _STAGE_KEY.match(stage_key):
            raise ValueError(f"stage_key {stage_key!r}: use letters, digits, '.', '_' or '-' (max 128)")
        requested = (spec, device_index)
        if self._call(self._needs_replacing, stage_key, requested):
            self.stop(stage_key)
        return self._call(self._start, stage_key, requested)

    def stop(self, stage_key: str) -> StageStatus | None:
        """SIGTERM, SIGKILL after the grace period; returns once the process is gone."""
        return self._call(self._request_stop, stage_key).result(timeout=self._max_wait(stage_key))

    def drain(self, stage_key: str) -> StageStatus | None:
        """SIGTERM (the stage finishes in-flight work and exits); does not wait for the exit."""
        self._call(self._request_stop, stage_key)
        return self._call(self._status_of, stage_key)

    def sync(self, wanted: Sequence[str]) -> list[str]:
        """Stop every stage not in ``wanted``; returns the keys stopped."""
        waits = self._call(self._stop_unwanted, set(wanted))
        for key, waiter in waits.items():
            waiter.result(timeout=self._max_wait(key))
        return sorted(waits)

    def snapshot(self) -> list[tuple[StageStatus, StageLoad]]:
        """Every stage's status and load; empty once closed (nothing runs any more)."""
        try:
            return self._call(self._snapshot)
        except SupervisorClosed:
            return []

    def close(self) -> None:
        """Stop every stage (no orphans) and end the loop."""
        if self._closed.is_set():
            return
        self.sync([])
        with self._closing:
            self._closed.set()
        self._thread.join(timeout=5)

    def _call(self, fn: Callable, *args: Any) -> Any:
        future: Future = Future()
        with self._closing:
            if self._closed.is_set():
                raise SupervisorClosed("the supervisor is closed")
            self._inbox.put((fn, args, future))
        return future.result(timeout=30)

    def _max_wait(self, stage_key: str) -> float:
        return self._call(self._grace_of, stage_key) + 10.0

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                fn, args, future = self._inbox.get(timeout=POLL_S)
            except queue.Empty:
                pass
            else:
                try:
                    result = fn(*args)
                except Exception as exc:  # handed to the caller, who reports it
                    if future is None:
                        log.exception("supervisor: %s failed", fn.__name__)
                    else:
                        future.set_exception(exc)
                else:
                    if future is not None:
                        future.set_result(result)
            try:
                self._tick(time.monotonic())
            except Exception:  # keep supervising the other stages; the next tick tries again
                log.exception("supervisor tick failed")
        while not self._inbox.empty():  # calls that raced with close: answer them, never leave them hanging
            _, _, future = self._inbox.get_nowait()
            if future is not None:
                future.set_exception(SupervisorClosed("the supervisor is closed"))

    def _tick(self, now: float) -> None:
        for stage in list(self._stages.values()):
            run = stage.run
            if run is None:
                if stage.restart_at is not None and now >= stage.restart_at:
                    stage.restart_at = None
                    self._spawn(stage)
                continue
            code = run.popen.poll()
            if code is not None:
                self._on_exit(stage, run, code)
            elif stage.kill_at is not None and now >= stage.kill_at:
                log.warning("stage %s did not stop within its grace period: SIGKILL", stage.key)
                signal_group(run.popen.pid, signal.SIGKILL)
                stage.kill_at = None
            elif stage.crashes and now - run.started > self._policy.stable_after_s:
                stage.crashes = 0

    # --- handlers, run on the loop thread ------------------------------------------------------

    def _needs_replacing(self, key: str, requested: tuple[dict[str, Any], int | None]) -> bool:
        stage = self._stages.get(key)
        return bool(stage and stage.alive and (stage.requested != requested or stage.stop_requested))

    def _start(self, key: str, requested: tuple[dict[str, Any], int | None]) -> StageStatus:
        spec, device_index = requested
        stage = self._stages.get(key)
        if stage is not None:
            if stage.alive and stage.requested == requested and not stage.stop_requested:
                return _copy(stage.status)  # idempotent: already running this spec
            if stage.alive:
                raise RuntimeError(f"stage {key} is still running another spec")
            del self._stages[key]  # exited, failed or waiting to restart: start afresh
        deployment, replica, index = identity_of(spec)
        status = StageStatus(key, deployment, replica, index, "starting")
        # Memory is held by running stages and by crashed ones about to restart, not by failed or exited ones.
        others = [s.admitted for s in self._stages.values() if s.alive or s.restart_at is not None]
        try:
            admitted = self._admission.admit(spec, others, device_index)
        except StageRefused as exc:
            status.state, status.message = "failed", f"refused: {exc}"
            self._stages[key] = _Stage(key, requested, Admitted(spec, None, 0), status)
            self._emit(self._stages[key])
            return _copy(status)
        stage = _Stage(key, requested, admitted, status)
        self._stages[key] = stage
        self._spawn(stage)
        return _copy(stage.status)

    def _spawn(self, stage: _Stage) -> None:
        stage_dir = self._dir / stage.key
        stage_dir.mkdir(exist_ok=True, mode=0o700)
        spec_path = stage_dir / "spec.json"
        spec_path.touch(mode=0o600)
        spec_path.write_text(json.dumps(stage.admitted.spec, indent=1))
        try:
            with open(stage_dir / "stderr.log", "ab") as stderr:
                popen = subprocess.Popen(
                    [*self._command, "--spec", str(spec_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                    start_new_session=True,
                    preexec_fn=die_with_parent(),
                    env=_stage_env(),
                    cwd=stage_dir,
                )
        except OSError as exc:
            stage.status.state, stage.status.message = "failed", f"cannot start the stage process: {exc}"
            self._emit(stage)
            return
        write_pid_record(stage_dir / "pid.json", popen.pid)
        run = _Run(popen, time.monotonic())
        run.reader = threading.Thread(target=self._read_stdout, args=(stage.key, run), daemon=True,
                                      name=f"stage-{stage.key}-stdout")
        run.reader.start()
        stage.run, stage.last_stats, stage.load = run, None, (0.0, 0.0, 0.0)
        stage.status.state, stage.status.pid = "starting", popen.pid
        self._emit(stage)

    def _read_stdout(self, key: str, run: _Run) -> None:
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
            self._inbox.put((self._on_message, (key, run, message, time.monotonic()), None))
        run.popen.stdout.close()

    def _on_message(self, key: str, run: _Run, message: dict[str, Any], at: float) -> None:
        stage = self._stages.get(key)
        if stage is None or stage.run is not run:
            return  # a line from a process that has since been replaced
        event = message.get("event")
        if event == "ready" and stage.status.state == "starting":
            stage.status.state, stage.status.message = "ready", ""
            self._emit(stage)
        elif event == "stats":
            stats = {k: v for k, v in message.items() if k != "event"}
            if stage.last_stats is not None:
                stage.load = _load_between(*stage.last_stats, at, stats)
            stage.last_stats = (at, stats)
            stage.status.stats = stats

    def _on_exit(self, stage: _Stage, run: _Run, code: int) -> None:
        signal_group(run.popen.pid, signal.SIGKILL)  # whatever the stage left behind in its group
        if run.reader is not None:
            run.reader.join(timeout=0.5)  # so a last {"event": "error"} is read
        (self._dir / stage.key / "pid.json").unlink(missing_ok=True)
        stage.run, stage.kill_at, stage.load = None, None, (0.0, 0.0, 0.0)
        status = stage.status
        status.pid, status.exit_code = None, code
        if stage.stop_requested:
            status.state, status.message = "exited", "stopped on request"
            self._finish_stop(stage)
            return
        if code == 0:
            status.state, status.message = "exited", "exited on its own with code 0"
            self._emit(stage)
            return
        reason = f"{_describe_exit(code)}: {run.last_error or _stderr_tail(self._dir / stage.key)}"
        if stage.crashes >= self._policy.max_restarts:
            status.state = "failed"
            status.message = f"{reason}; gave up after {status.restarts} restarts"
        else:
            stage.crashes += 1
            status.restarts += 1
            delay = self._policy.delay(stage.crashes)
            stage.restart_at = time.monotonic() + delay
            status.state = "starting"
            status.message = f"{reason}; restart {stage.crashes}/{self._policy.max_restarts} in {delay:.1f} s"
        log.warning("stage %s: %s", stage.key, status.message)
        self._emit(stage)

    def _request_stop(self, key: str) -> Future:
        done: Future = Future()
        stage = self._stages.get(key)
        if stage is None:
            done.set_result(None)
            return done
        stage.stop_requested = True
        if not stage.alive:  # failed, exited or waiting out a backoff: nothing to signal
            stage.restart_at = None
            stage.status.state = "exited" if stage.status.state != "failed" else "failed"
            stage.status.message = stage.status.message or "stopped on request"
            stage.waiters.append(done)
            self._finish_stop(stage)
            return done
        if stage.status.state != "draining":
            assert stage.run is not None
            signal_group(stage.run.popen.pid, signal.SIGTERM)
            stage.status.state = "draining"
            stage.kill_at = time.monotonic() + self._policy.grace(stage.admitted.spec)
            self._emit(stage)
        stage.waiters.append(done)
        return done

    def _finish_stop(self, stage: _Stage) -> None:
        self._stages.pop(stage.key, None)
        (self._dir / stage.key / "spec.json").unlink(missing_ok=True)
        self._emit(stage)
        for waiter in stage.waiters:
            waiter.set_result(_copy(stage.status))

    def _stop_unwanted(self, wanted: set[str]) -> dict[str, Future]:
        return {key: self._request_stop(key) for key in list(self._stages) if key not in wanted}

    def _status_of(self, key: str) -> StageStatus | None:
        stage = self._stages.get(key)
        return _copy(stage.status) if stage else None

    def _grace_of(self, key: str) -> float:
        stage = self._stages.get(key)
        return self._policy.grace(stage.admitted.spec) if stage else 0.0

    def _snapshot(self) -> list[tuple[StageStatus, StageLoad]]:
        return [
            (_copy(s.status),
             StageLoad(s.admitted.device_index, s.admitted.memory_bytes if s.alive else 0, *s.load))
            for s in self._stages.values()
        ]

    def _emit(self, stage: _Stage) -> None:
        try:
            self._on_event(_copy(stage.status))
        except Exception:  # a broken listener must not stop supervision
            log.exception("stage event listener failed")


def _copy(status: StageStatus) -> StageStatus:
    return replace(status, stats=dict(status.stats))


def _stage_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"  # one stdout line per event, as it happens
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # cuda:N is NVML's device N
    return env


def _load_between(
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
