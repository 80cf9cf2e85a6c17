"""GPU check, step 4: `make run`'s path on this host, answering a chat request, with its telemetry.

    python benchmarks/gpu_check_serve.py --work DIR --model DIR [--emulate] [--json OUT] [--timeout 240]

A fresh embedded install under DIR/var (SQLite, the filesystem broker), then ``manage.py run_local``
with the demo: on a GPU host ``--no-emulate`` (one local agent discovering this host's GPUs through
NVML, the demo model planned onto them and served by a stage on ``cuda:N``); with ``--emulate`` (the
dry run) one agent emulating a one-T4 fleet on the CPU. Once the launcher says READY: one request
through the OpenAI-compatible gateway (``POST /v1/chat/completions``), the devices as the REST API
lists them, the latest telemetry sample per node (``GET /api/v1/telemetry/``, where the control
plane has it) and the device and stage series the dashboard reads (``/dashboard/telemetry/``, a
logged-in session). The launcher is then stopped with SIGTERM (it stops
the agents, which stop their stages) and anything it started that outlives it is killed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
FLEET = "name: gpu-check\nnodes:\n  - name: gpu-check\n    address: 127.0.0.1\n    gpus:\n      - model: T4\n"
# Short clocks, as the end-to-end tests use: a lost stage or a missed heartbeat shows within seconds.
TIMING = {
    "MOTLEY_AGENT_HEARTBEAT_INTERVAL_S": "1",
    "MOTLEY_NODE_HEALTH_CHECK_INTERVAL_S": "1",
    "MOTLEY_RECONCILE_INTERVAL_S": "2",
    "MOTLEY_EMULATION_TIME_SCALE": "1",
    "MOTLEY_LOG_LEVEL": "WARNING",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(var: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    base = 20000 + random.randrange(120) * 100  # below the ephemeral ports (tests/e2e/harness.stage_ports)
    return {
        **env,
        **TIMING,
        "MOTLEY_VAR_DIR": str(var),
        "MOTLEY_STAGE_PORTS": f"{base}-{base + 99}",
        "PYTHONUNBUFFERED": "1",
    }


class Launcher:
    """``manage.py run_local`` as a child, with every process it starts remembered for the clean-up."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.process = subprocess.Popen(
            argv, env=env, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
        )
        self.seen: dict[int, psutil.Process] = {}

    def remember_children(self) -> None:
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self.seen.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, grace_s: float = 40.0) -> list[str]:
        """SIGTERM the launcher (it stops its children), then kill whatever it started that is left."""
        self.remember_children()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        left = []
        for child in self.seen.values():
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(child.cmdline())[:120])
                    child.kill()
            except psutil.Error:
                continue
        return left


def wait_ready(launcher: Launcher, key_file: Path, deadline: float) -> str:
    """The demo's API key once the launcher printed READY; RuntimeError if it exits or time runs out."""
    while time.monotonic() < deadline:
        launcher.remember_children()
        if "demo: READY" in launcher.output() and key_file.exists():
            return key_file.read_text().strip()
        if launcher.process.poll() is not None:
            raise RuntimeError(f"run_local exited with code {launcher.process.returncode}")
        time.sleep(0.5)
    raise RuntimeError("the demo deployment was not READY in time")


def chat(base: str, key: str) -> dict:
    body = {"model": "motley-demo", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}
    started = time.monotonic()
    response = httpx.post(
        f"{base}/v1/chat/completions", json=body, timeout=120, headers={"Authorization": f"Bearer {key}"}
    )
    answer = {"status": response.status_code, "seconds": round(time.monotonic() - started, 3)}
    try:
        payload = response.json()
    except ValueError:
        return {**answer, "body": response.text[:500]}
    if response.status_code == 200:
        answer["content"] = payload["choices"][0]["message"]["content"]
        answer["usage"] = payload.get("usage")
    else:
        answer["body"] = payload
    return answer


def logged_in(base: str, credentials: dict[str, str]) -> httpx.Client:
    """A browser-like session: the dashboard's telemetry API takes a login, not an API token."""
    client = httpx.Client(base_url=base, timeout=30)
    page = client.get("/accounts/login/")
    token = (
        client.cookies.get("csrftoken")
        or re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
    )
    done = client.post(
        "/accounts/login/",
        data={
            "username": credentials["username"],
            "password": credentials["password"],
            "csrfmiddlewaretoken": token,
        },
    )
    if done.status_code != 302:
        raise RuntimeError(f"dashboard login answered {done.status_code}")
    return client


def telemetry(client: httpx.Client, deadline: float) -> dict:
    """The latest device and stage samples the dashboard API holds, once both have at least one."""
    found: dict = {}
    while time.monotonic() < deadline:
        for kind in ("device", "stage"):
            series = client.get("/dashboard/telemetry/", params={"kind": kind, "window": 300}).json()[
                "series"
            ]
            found[kind] = {
                key: {f: (v[-1] if v else None) for f, v in columns.items()} | {"samples": len(columns["t"])}
                for key, columns in series.items()
                if columns["t"]
            }
        if found["device"] and found["stage"]:
            break
        time.sleep(1.0)
    return found


def api_telemetry(base: str, token: str) -> dict:
    """``GET /api/v1/telemetry/`` where the control plane has it: each node's latest heartbeat sample
    (every GpuMetrics field, throttle reasons included, and the stages' statistics)."""
    response = httpx.get(f"{base}/api/v1/telemetry/", headers={"Authorization": f"Token {token}"}, timeout=30)
    if response.status_code != 200:
        return {"status": response.status_code}
    return {"status": 200, "nodes": response.json().get("nodes", [])}


def check(args: argparse.Namespace, result: dict) -> None:
    var = args.work / "var"
    shutil.rmtree(var, ignore_errors=True)
    var.mkdir(parents=True)
    env = embedded_env(var)
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=env, cwd=REPO, check=True, timeout=180)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [*manage, "run_local", "--port", str(port), "--demo-model", str(args.model)]
    if args.emulate:
        fleet = args.work / "fleet.yaml"
        fleet.write_text(FLEET)
        argv += ["--demo-fleet", str(fleet)]
    else:
        argv += ["--no-emulate"]
    result["launcher"] = " ".join(argv[1:])
    started = time.monotonic()
    launcher = Launcher(argv, env, args.work / "run_local.log")
    try:
        key = wait_ready(launcher, var / "demo-api-key.txt", started + args.timeout - 45)
        result["ready_after_s"] = round(time.monotonic() - started, 1)
        result["chat"] = chat(base, key)
        credentials = dict(
            line.split(": ", 1) for line in (var / "admin-credentials.txt").read_text().splitlines()
        )
        devices = httpx.get(
            f"{base}/api/v1/devices/",
            headers={"Authorization": f"Token {credentials['api_token']}"},
            timeout=30,
        ).json()["results"]
        fields = ("name", "model_name", "memory_bytes", "pcie_gen", "pcie_lanes", "nvlink_island", "emulated")
        result["devices"] = [{f: d[f] for f in fields} for d in devices]
        result["api_telemetry"] = api_telemetry(base, credentials["api_token"])
        client = logged_in(base, credentials)
        try:
            result["telemetry"] = telemetry(client, time.monotonic() + 20)
        finally:
            client.close()
    finally:
        result["left_running"] = launcher.stop()
        result["launcher_tail"] = launcher.output()[-3000:]
    problems = []
    if result["chat"]["status"] != 200 or not (result["chat"].get("usage") or {}).get("completion_tokens"):
        problems.append(f"chat request: {result['chat']}")
    if not result["devices"] or any(d["emulated"] != args.emulate for d in result["devices"]):
        problems.append(f"devices: expected emulated={args.emulate}: {result['devices']}")
    api = result["api_telemetry"]
    if api["status"] == 200 and not any(n["devices"] and n["stages"] for n in api["nodes"]):
        problems.append(f"GET /api/v1/telemetry/: a node with devices and stages expected: {api}")
    if not result["telemetry"].get("device") or not result["telemetry"].get("stage"):
        problems.append(f"telemetry: device and stage samples expected: {result['telemetry']}")
    result["problems"] = problems


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # a SIGTERM (the step's time limit) still stops the launcher and its children


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work", type=Path, required=True, help="a folder for the install, logs and fleet file"
    )
    parser.add_argument("--model", type=Path, required=True, help="the checkpoint to serve")
    parser.add_argument("--emulate", action="store_true", help="emulate a one-T4 fleet on the CPU (dry run)")
    parser.add_argument("--json", type=Path, help="write the result to this file")
    parser.add_argument("--timeout", type=float, default=240, help="seconds for the whole step")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _interrupt)
    args.work.mkdir(parents=True, exist_ok=True)
    result: dict = {"emulate": args.emulate}
    try:
        check(args, result)
    except (Exception, KeyboardInterrupt) as exc:
        result.setdefault("problems", []).append(f"{type(exc).__name__}: {exc}")
    finally:
        if args.json:
            args.json.write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "launcher_tail"}, indent=2, default=str))
    if result["problems"]:
        print("launcher output (tail):\n" + result.get("launcher_tail", ""))
        print("problems:\n- " + "\n- ".join(result["problems"]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
