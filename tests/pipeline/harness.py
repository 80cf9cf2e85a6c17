"""Starting real stage processes for tests and the benchmark: specs, ready events, and certain cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from contracts.stage_spec import StageSpec
from tests.support.processes import REPO_ROOT, free_port

TOKEN = "test-token-123"


def split_layers(num_layers: int, num_stages: int) -> list[tuple[int, int]]:
    bounds = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    return list(zip(bounds, bounds[1:]))


def pipeline_specs(model: Path, num_layers: int, num_stages: int, pipeline_id: str = "p0",
                   hosts: list[str] | None = None, **overrides) -> list[StageSpec]:
    """``hosts``: each stage's address (default loopback; benchmarks/netns_pipeline.py: its node's)."""
    ports = [free_port() for _ in range(num_stages)]
    addresses = [f"tcp://{host}:{p}" for host, p in zip(hosts or ["127.0.0.1"] * num_stages, ports)]
    per_stage = overrides.pop("per_stage", {})
    return [
        StageSpec.from_dict(
            {
                "pipeline_id": pipeline_id,
                "auth_token": TOKEN,
                "model_path": str(model),
                "stage_index": i,
                "num_stages": num_stages,
                "layers": list(layers),
                "listen": addresses[i],
                "next": addresses[i + 1] if i + 1 < num_stages else None,
                "head": addresses[0],
                "threads": 1,
                "kv_tokens": 2048,
                "peer_timeout_s": 2.0,
                **overrides,
                **per_stage.get(i, {}),
            }
        )
        for i, layers in enumerate(split_layers(num_layers, num_stages))
    ]


@dataclass
class StageProcess:
    spec: StageSpec
    popen: subprocess.Popen
    events: "queue.Queue[dict]" = field(default_factory=queue.Queue)
    stderr_lines: list[str] = field(default_factory=list)
    bad_stdout: list[str] = field(default_factory=list)  # contracts §1: stdout is JSON lines only

    def wait_event(self, name: str, timeout_s: float = 60.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"stage {self.spec.stage_index} exited {self.popen.returncode}: "
                                       f"{self.stderr()}")
                continue
            if event.get("event") == name:
                return event
        raise TimeoutError(f"stage {self.spec.stage_index} sent no {name!r} event in {timeout_s}s: "
                           f"{self.stderr()}")

    def stderr(self) -> str:
        return "".join(self.stderr_lines[-30:])


class Pipeline:
    """Stage processes started from specs; :meth:`stop` kills whatever is left (children included)."""

    def __init__(self, specs: list[StageSpec], workdir: Path,
                 launcher: Callable[[int], list[str]] = lambda i: [], env: dict[str, str] | None = None):
        """``launcher(i)``: the argv prefix stage i runs under (e.g. ``ip netns exec <its node>``);
        ``env``: variables the stages get besides this process's (the OTEL_* ones of a traced test)."""
        self.specs, self.workdir, self.launcher, self.env = specs, workdir, launcher, env or {}
        self.stages: list[StageProcess] = [self.start(i) for i in range(len(specs))]
        self.ready_events: list[dict] = []  # each stage's, once ``wait_ready`` saw them

    @property
    def head(self) -> str:
        return self.specs[0].listen

    def start(self, index: int) -> StageProcess:
        spec = self.specs[index]
        path = self.workdir / f"stage{index}.json"
        path.write_text(json.dumps(spec.to_json()))
        env = {**os.environ, **self.env, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": str(spec.threads)}
        popen = subprocess.Popen(
            [*self.launcher(index), sys.executable, "-m", "worker_runtime.serve", "--spec", str(path),
             "--spec-inbox"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        proc = StageProcess(spec, popen)
        threading.Thread(target=self._pump_stdout, args=(proc,), daemon=True).start()
        threading.Thread(target=self._pump_stderr, args=(proc,), daemon=True).start()
        return proc

    @staticmethod
    def _pump_stdout(proc: StageProcess) -> None:
        for line in proc.popen.stdout:
            try:
                proc.events.put(json.loads(line))
            except json.JSONDecodeError:
                proc.bad_stdout.append(line)

    @staticmethod
    def _pump_stderr(proc: StageProcess) -> None:
        for line in proc.popen.stderr:
            proc.stderr_lines.append(line)

    def wait_ready(self, timeout_s: float = 60.0) -> list[dict]:
        return [stage.wait_event("ready", timeout_s) for stage in self.stages]

    def respec(self, index: int, spec: StageSpec) -> None:
        """Hand stage ``index``'s running process a new spec in place (worker_runtime/spec_inbox.py)."""
        self.specs[index] = spec
        self.stages[index].spec = spec
        path = self.workdir / f"stage{index}-{time.monotonic_ns()}.json"
        path.write_text(json.dumps(spec.to_json()))
        stdin = self.stages[index].popen.stdin
        stdin.write(f"{path}\n")
        stdin.flush()

    def restart(self, index: int) -> StageProcess:
        self.stages[index] = self.start(index)
        return self.stages[index]

    def pids(self) -> list[int]:
        return [s.popen.pid for s in self.stages]

    def stop(self) -> None:
        for stage in self.stages:
            if stage.popen.poll() is None:
                stage.popen.terminate()
        for stage in self.stages:
            try:
                stage.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stage.popen.kill()
                stage.popen.wait(timeout=5)

    def assert_clean(self) -> None:
        """No stage process left running, and nothing but JSON lines on any stage's stdout."""
        self.assert_none_left()
        bad = [line for stage in self.stages for line in stage.bad_stdout]
        assert not bad, f"non-JSON lines on a stage's stdout: {bad[:5]}"

    def assert_none_left(self) -> None:
        alive = [pid for pid in self.pids()
                 if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"stage processes left running: {alive}"


async def wait_healthy(client, timeout_s: float = 30.0) -> dict:
    """Poll ``client.health()`` until the whole pipeline serves (or give up and return the last answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = await client.health()
        if health["ok"] or time.monotonic() > deadline:
            return health
        await asyncio.sleep(0.05)
