"""Stage processes: which run, restarting crashes, stopping them; the interface other threads call.

One thread (the supervisor loop) owns every stage record and makes every fork. That is not only
tidy locking: PR_SET_PDEATHSIG fires when the *thread* that forked a child exits, so spawning from
short-lived threads (a Celery task, a timer) would kill stages at random. Other threads talk to the
loop through its inbox and wait on futures. The loop polls exits every 0.1 s, so an exit is reported
well within the 2 s the protocol promises.

A stage's states and the moves between them are agents/stage_states.py; how one process of a stage
is started, read and told apart on exit is agents/stage_process.py.
"""

from __future__ import annotations

import logging
import queue
import re
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents import stage_states
from agents.admission import Admission, Admitted
from agents.fork_server import ForkServer
from agents.load_priority import LoadPriority
from agents.memory_budget import StageRefused
from agents.processes import signal_group, sweep_pid_records
from agents.restart_policy import RestartPolicy
from agents.stage_process import (
    DEFAULT_COMMAND,
    FORK_SERVER_COMMAND,
    SpawnFailed,
    StageRun,
    crash_reason,
    reap,
    respec,
    spawn,
    usage_between,
)
from agents.stage_record import StageRecord
from agents.stage_usage import StageUsage
from contracts.stage_spec import SpecError, StageSpec, respec_blocker, spec_digest
from contracts.stage_status import StageStatus, identity_of

log = logging.getLogger(__name__)

POLL_S = 0.1
# While a stop waits for its process to exit: a replaced stage's successor starts only then, so in an
# in-place handover each replaced stage of an agent waited out up to a whole POLL_S (they go one by one).
EXIT_POLL_S = 0.01
_STAGE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class SupervisorClosed(RuntimeError):
    """The agent is shutting down: no stage is started, stopped or listed any more."""


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
        self._stages: dict[str, StageRecord] = {}
        self._priority = LoadPriority()
        # The fork server (agents/fork_server.py) and new specs in place (worker_runtime/spec_inbox.py)
        # are worker_runtime.serve's: only for that command.
        self._serve_command = tuple(command) == DEFAULT_COMMAND
        self._forks = (ForkServer(self._dir, FORK_SERVER_COMMAND, idle=self._priority.idle)
                       if self._serve_command else None)
        self._inbox: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._closing = threading.Lock()  # orders "closed?" + put against "close" + emptying the inbox
        self.swept_pids = sweep_pid_records(sorted(self._dir.glob("*/pid.json")))
        self._thread = threading.Thread(target=self._loop, name="stage-supervisor", daemon=True)
        self._thread.start()

    # --- interface for other threads -------------------------------------------------------------

    def start(self, stage_key: str, spec: dict[str, Any], device_index: int | None = None,
              background: bool = False) -> StageStatus:
        """Run the spec under this key. The same spec again changes nothing; a different one is handed
        to the running process when it can take it in place (``respec_blocker``: same pipeline, place,
        address and device; the stage reloads only what changed, in the same process), else (or a
        start while the stage drains) the running process is stopped first, with SIGUSR1: a replaced
        stage stops at once instead of draining requests its replaced neighbours cannot finish."""
        if not _STAGE_KEY.match(stage_key):
            raise ValueError(f"stage_key {stage_key!r}: use letters, digits, '.', '_' or '-' (max 128)")
        requested = (spec, device_index)
        if (status := self._call(self._respec, stage_key, requested)) is not None:
            return status
        if self._call(self._needs_replacing, stage_key, requested):
            self._call(self._request_stop, stage_key, signal.SIGUSR1).result(
                timeout=self._max_wait(stage_key))
        return self._call(self._start, stage_key, requested, background)

    def stop(self, stage_key: str) -> StageStatus | None:
        """SIGTERM, SIGKILL after the grace period; returns once the process is gone."""
        return self._call(self._request_stop, stage_key).result(timeout=self._max_wait(stage_key))

    def sync(self, wanted: Sequence[str]) -> list[str]:
        """Stop every stage not in ``wanted``; returns the keys stopped."""
        waits = self._call(self._stop_unwanted, set(wanted))
        for key, waiter in waits.items():
            waiter.result(timeout=self._max_wait(key))
        return sorted(waits)

    def snapshot(self) -> list[tuple[StageStatus, StageUsage]]:
        """Every stage's status and usage of its device; empty once closed (nothing runs any more)."""
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
                stopping = any(s.alive and s.stop_requested for s in self._stages.values())
                fn, args, future = self._inbox.get(timeout=EXIT_POLL_S if stopping else POLL_S)
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
        if self._forks is not None:
            self._forks.close()
        self._priority.close()
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
            if stage.loads_idle_until is not None and now >= stage.loads_idle_until:
                self._loaded(stage)
        loading = any(s.alive and s.status.state == "starting" for s in self._stages.values())
        if self._forks is not None and not loading:
            # Not while stages load: its imports would slow them down; capped while stages serve.
            self._forks.replenish(now, capped=any(s.status.state == "ready" for s in self._stages.values()))

    # --- handlers, run on the loop thread ------------------------------------------------------

    def _needs_replacing(self, key: str, requested: tuple[dict[str, Any], int | None]) -> bool:
        stage = self._stages.get(key)
        return bool(stage and stage.alive and (stage.requested != requested or stage.stop_requested))

    def _respec(self, key: str, requested: tuple[dict[str, Any], int | None]) -> StageStatus | None:
        """Hand a running stage a new spec in place, when it can take it and its device holds it with the
        new spec (checked as a start is); None when not: the caller replaces the process instead."""
        stage = self._stages.get(key)
        spec, device_index = requested
        if not (self._serve_command and stage is not None and stage.run is not None
                and not stage.stop_requested and stage.status.state in ("starting", "ready")
                and stage.requested != requested and stage.requested[1] == device_index
                and respec_blocker(stage.requested[0], spec) is None):
            return None
        try:
            parsed = StageSpec.from_dict(spec)
            admitted = self._admission.admit(parsed, self._holding_memory(besides=stage), device_index)
        except (SpecError, StageRefused):
            return None  # replaced the ordinary way, which says why it is refused
        written = admitted.spec.to_json()
        if admitted.device_index != stage.admitted.device_index or not respec(stage.run, self._dir / key,
                                                                              written):
            return None
        stage.requested, stage.admitted = requested, admitted
        stage.loading_digest = spec_digest(written)
        stage_states.respecced(stage.status, spec_digest(spec))
        self._emit(stage)
        return _copy(stage.status)

    def _start(self, key: str, requested: tuple[dict[str, Any], int | None],
               background: bool = False) -> StageStatus:
        spec, device_index = requested
        stage = self._stages.get(key)
        if stage is not None:
            if stage.alive and stage.requested == requested and not stage.stop_requested:
                return _copy(stage.status)  # idempotent: already running this spec
            if stage.alive:
                raise RuntimeError(f"stage {key} is still running another spec")
            del self._stages[key]  # exited, failed or waiting to restart: start afresh
        status = StageStatus(key, None, None, None, "starting", spec_digest=spec_digest(spec))
        parsed = None
        try:
            parsed = StageSpec.from_dict(spec)  # the spec as sent is what its reports name (spec_digest)
            status.deployment_id, status.replica, status.stage_index = identity_of(parsed)
            admitted = self._admission.admit(parsed, self._holding_memory(), device_index)
        except (SpecError, StageRefused) as exc:
            stage_states.failed(status, f"refused: {exc}")
            self._stages[key] = StageRecord(key, requested, Admitted(parsed, None, 0), status)
            self._emit(self._stages[key])
            return _copy(status)
        stage = StageRecord(key, requested, admitted, status, background=background)
        self._stages[key] = stage
        self._spawn(stage)
        return _copy(stage.status)

    def _holding_memory(self, besides: StageRecord | None = None) -> list[Admitted]:
        """What the stages other than ``besides`` hold: running ones and crashed ones about to restart, not
        failed or exited ones."""
        return [s.admitted for s in self._stages.values()
                if s is not besides and (s.alive or s.restart_at is not None)]

    def _spawn(self, stage: StageRecord) -> None:
        key = stage.key

        def on_message(run: StageRun, message: dict[str, Any], at: float) -> None:  # on the reader thread
            self._inbox.put((self._on_message, (key, run, message, at), None))

        written = stage.admitted.spec.to_json()
        try:
            run = spawn(self._command, self._dir / key, written, on_message,
                        self._forks.take if self._forks is not None else None, inbox=self._serve_command)
        except SpawnFailed as exc:
            stage_states.failed(stage.status, str(exc))
            self._emit(stage)
            return
        stage.run, stage.last_stats, stage.usage = run, None, (0.0, 0.0, 0.0)
        stage.loading_digest = spec_digest(written)
        stage_states.spawned(stage.status, run.pid)
        stage.loads_idle_until = self._priority.lowered(run.pid, stage.background)
        self._emit(stage)

    def _loaded(self, stage: StageRecord) -> None:
        """Loading is over (ready, or LOAD_IDLE_S passed): the stage is scheduled normally again."""
        if stage.loads_idle_until is not None and stage.run is not None:
            self._priority.restored(stage.run.pid)
        stage.loads_idle_until = None

    def _on_message(self, key: str, run: StageRun, message: dict[str, Any], at: float) -> None:
        stage = self._stages.get(key)
        if stage is None or stage.run is not run:
            return  # a line from a process that has since been replaced
        event = message.get("event")
        # A "ready" of the spec the process ran before it was handed the current one says nothing of this one.
        current = message.get("spec_digest", stage.loading_digest) == stage.loading_digest
        if event == "ready" and current and stage_states.ready(stage.status):
            self._loaded(stage)
            self._emit(stage)
        elif event == "health":
            broken = message.get("broken_stage")
            broken = broken if type(broken) is int and message.get("ok") is False else None
            if broken != stage.status.broken_stage:  # told at once: it may say another node's agent died
                stage.status.broken_stage = broken
                self._emit(stage)
        elif event == "stats":
            stats = {k: v for k, v in message.items() if k != "event"}
            if stage.last_stats is not None:
                stage.usage = usage_between(*stage.last_stats, at, stats)
            stage.last_stats = (at, stats)
            stage.status.stats = stats

    def _on_exit(self, stage: StageRecord, run: StageRun, code: int) -> None:
        reap(run, self._dir / stage.key)
        stage.run, stage.kill_at, stage.usage = None, None, (0.0, 0.0, 0.0)
        stage_states.process_exited(stage, code, self._policy, time.monotonic(),
                                    why=lambda: crash_reason(run, code, self._dir / stage.key))
        if stage.stop_requested:
            self._finish_stop(stage)
            return
        if code != 0:
            log.warning("stage %s: %s", stage.key, stage.status.message)
        self._emit(stage)

    def _request_stop(self, key: str, sig: int = signal.SIGTERM) -> Future:
        """SIGTERM drains (contracts §1); SIGUSR1, for a stage replaced by a new spec, stops it at once
        (also one already draining)."""
        done: Future = Future()
        stage = self._stages.get(key)
        if stage is None:
            done.set_result(None)
            return done
        stage.stop_requested = True
        if not stage.alive:  # failed, exited or waiting out a backoff: nothing to signal
            stage.restart_at = None
            stage_states.stopped_without_process(stage.status)
            stage.waiters.append(done)
            self._finish_stop(stage)
            return done
        if stage.status.state != "draining" or sig != signal.SIGTERM:
            assert stage.run is not None
            signal_group(stage.run.popen.pid, sig)
            stage_states.draining(stage.status)
            stage.kill_at = time.monotonic() + self._policy.grace(stage.admitted.spec)
            self._emit(stage)
        stage.waiters.append(done)
        return done

    def _finish_stop(self, stage: StageRecord) -> None:
        self._stages.pop(stage.key, None)
        (self._dir / stage.key / "spec.json").unlink(missing_ok=True)
        self._emit(stage)
        for waiter in stage.waiters:
            waiter.set_result(_copy(stage.status))

    def _stop_unwanted(self, wanted: set[str]) -> dict[str, Future]:
        return {key: self._request_stop(key) for key in list(self._stages) if key not in wanted}

    def _grace_of(self, key: str) -> float:
        stage = self._stages.get(key)
        return self._policy.grace(stage.admitted.spec) if stage else 0.0

    def _snapshot(self) -> list[tuple[StageStatus, StageUsage]]:
        return [(_copy(s.status), s.admitted.usage(s.usage, alive=s.alive)) for s in self._stages.values()]

    def _emit(self, stage: StageRecord) -> None:
        try:
            self._on_event(_copy(stage.status))
        except Exception:  # a broken listener must not stop supervision
            log.exception("stage event listener failed")


def _copy(status: StageStatus) -> StageStatus:
    return replace(status, stats=dict(status.stats))

