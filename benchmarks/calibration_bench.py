"""Calibration benchmark: the planner's per-stage prediction error before and after calibration, on
the emulated demo fleet as ``make run`` brings it up.

    .venv/bin/python benchmarks/calibration_bench.py [--fit-s 30] [--eval-s 40] [--concurrency 16]
        [--other-concurrency 4] [--time-scale 20] [--markdown]

It starts ``manage.py run_local`` (ASGI server, Celery worker and beat, two local agents emulating
examples/fleets/demo.yaml, the demo model, the planned demo deployment) in a fresh var/ directory,
then sends chat traffic through the gateway (``--concurrency`` requests at a time, 64 tokens each):

1. fit: at least ``--fit-s`` (the calibration window's length by default) and until every device of
   the deployment is calibrated (``GET /api/v1/plans/calibration/``: source "measured");
2. evaluate, on samples the fit has not seen (later in time): ``--eval-s`` at the same concurrency,
   and ``--eval-s`` at ``--other-concurrency`` (another batch per step, so another load to predict).

Each evaluation polls the calibration API once a second and keeps each stage's fresh observation:
its measured decode step (the stage's own statistics, contracts §4 ``decode_ms``) and the planner's
prediction for that stage at the same batch and context, raw (first principles) and calibrated
(raw x the device's stored factor at that moment). The error of a prediction is ``|predicted -
measured| / measured``. Per stage the table gives the error of its median prediction against its
median measurement ("stage error") and the median error of single observations (one second each, so
noise included); below it, the median over stages and over every observation.

The demo's stages are paced to ``time_scale x`` their modeled time on the emulated card
(``MOTLEY_EMULATION_TIME_SCALE``, 20 as ``make run`` has it; ``--time-scale`` sets another), or take
their CPU time when that is longer (a 100M-parameter model on one core per stage, four stages: on a
small machine mostly the case, and then the stages contend for cores). Calibration learns whichever
it is, as it would a real card's speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["Tell me about the sea.", "Write a short poem about GPUs.", "What is a pipeline?",
           "Explain quantization to a child.", "List three colours.", "Why is the sky blue?"]


def _ports(port: int) -> str:
    """Ten stage ports of this run's own (the demo's four stages), away from other runs'."""
    base = 21000 + port % 1000 * 10
    return f"{base}-{base + 9}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Demo:
    """``run_local`` with the demo, in its own var/ directory; stopped (the whole group) on exit."""

    def __init__(self, var: Path, time_scale: float) -> None:
        self.var, self.port = var, free_port()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL", "MOTLEY_CACHE_URL",
                                 "DJANGO_SETTINGS_MODULE")}
        self.env.update({"MOTLEY_VAR_DIR": str(var), "MOTLEY_CALIBRATION_INTERVAL_S": "1",
                         "MOTLEY_EMULATION_TIME_SCALE": str(time_scale),
                         "MOTLEY_STAGE_PORTS": _ports(self.port),
                         "MOTLEY_LOG_LEVEL": "WARNING"})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 900) -> None:
        manage = [sys.executable, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=self.env, cwd=ROOT, check=True)
        self.log = open(self.var / "run_local.log", "w")  # noqa: SIM115  (closed in stop)
        self.process = subprocess.Popen([*manage, "run_local", "--port", str(self.port)], env=self.env,
                                        cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout_s
        log = self.var / "run_local.log"
        while "demo: READY" not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"run_local did not bring the demo up:\n{log.read_text()}")
            time.sleep(1)
        lines = (self.var / "admin-credentials.txt").read_text().splitlines()
        credentials = dict(line.split(": ", 1) for line in lines)
        self.api = {"Authorization": f"Token {credentials['api_token']}"}
        self.key = (self.var / "demo-api-key.txt").read_text().strip()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 2)  # SIGINT: run_local stops its group
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)

    def get(self, path: str) -> dict:
        response = httpx.get(self.url + path, headers=self.api, timeout=30)
        response.raise_for_status()
        return response.json()


async def traffic(demo: Demo, concurrency: int, stop: asyncio.Event) -> int:
    """``concurrency`` chat requests at a time through the gateway until ``stop``; returns how many."""
    done = 0
    async with httpx.AsyncClient(base_url=demo.url, timeout=120,
                                 headers={"Authorization": f"Bearer {demo.key}"}) as client:
        async def user(i: int) -> None:
            nonlocal done
            while not stop.is_set():
                body = {"model": "motley-demo", "max_tokens": 64, "temperature": 0.8,
                        "messages": [{"role": "user", "content": PROMPTS[(i + done) % len(PROMPTS)]}]}
                response = await client.post("/v1/chat/completions", json=body)
                done += response.status_code == 200

        await asyncio.gather(*(user(i) for i in range(concurrency)))
    return done


async def phase(demo: Demo, deployment: int, concurrency: int, seconds: float, until=None,
                limit_s: float = 600) -> list[dict]:
    """Traffic for ``seconds`` and then until ``until(calibration)`` (at most ``limit_s``); each
    stage's fresh observations."""
    stop, seen, observations = asyncio.Event(), set(), []
    load = asyncio.create_task(traffic(demo, concurrency, stop))
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        await asyncio.sleep(1.0)
        body = await asyncio.to_thread(demo.get, f"/api/v1/plans/calibration/?deployment={deployment}")
        for key, stage in body["stages"].items():
            sample = (key, stage["measured_ms"], stage["batch"], stage["context"])
            if stage["age_s"] <= 2.0 and not stage["throttled"] and sample not in seen:
                seen.add(sample)
                observations.append({"stage": key, **stage})
        if time.monotonic() - started >= seconds and (until is None or until(body)):
            break
    stop.set()
    await load
    return observations


def error(predicted: float, measured: float) -> float:
    return abs(predicted - measured) / measured


def summary(observations: list[dict], layers: dict[str, str]) -> tuple[list[list], tuple, tuple]:
    by_stage: dict[str, list[dict]] = {}
    for o in observations:
        by_stage.setdefault(o["stage"], []).append(o)
    rows = []
    for key in sorted(by_stage):
        obs = by_stage[key]
        measured, raw, calibrated = (statistics.median(o[k] for o in obs)
                                     for k in ("measured_ms", "raw_ms", "calibrated_ms"))
        rows.append([key, obs[0]["device"], layers.get(key, ""), len(obs),
                     statistics.median(o["batch"] for o in obs), measured, raw, calibrated,
                     error(raw, measured), error(calibrated, measured),
                     statistics.median(error(o["raw_ms"], o["measured_ms"]) for o in obs),
                     statistics.median(error(o["calibrated_ms"], o["measured_ms"]) for o in obs)])
    stages = tuple(statistics.median(r[i] for r in rows) for i in (8, 9))
    every = tuple(statistics.median(error(o[k], o["measured_ms"]) for o in observations)
                  for k in ("raw_ms", "calibrated_ms"))
    return rows, stages, every


def print_table(title: str, rows: list[list], stages: tuple, every: tuple, markdown: bool) -> None:
    header = ["stage", "device", "layers, precision", "obs", "batch", "measured ms", "raw ms",
              "calibrated ms", "stage error raw", "stage error calibrated", "obs. error raw",
              "obs. error calibrated"]
    print(f"\n*{title}*\n" if markdown else f"\n{title}")
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
    else:
        print("  ".join(header))
    for r in rows:
        cells = [r[0], r[1], r[2], str(r[3]), f"{r[4]:.1f}", f"{r[5]:.2f}", f"{r[6]:.3f}", f"{r[7]:.2f}",
                 f"{100 * r[8]:.0f} %", f"{100 * r[9]:.1f} %", f"{100 * r[10]:.0f} %", f"{100 * r[11]:.1f} %"]
        print(("| " + " | ".join(cells) + " |") if markdown else "  ".join(cells))
    print(f"\nmedian error over stages: raw {100 * stages[0]:.0f} %, calibrated {100 * stages[1]:.1f} %; "
          f"over every observation: raw {100 * every[0]:.0f} %, calibrated {100 * every[1]:.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fit-s", type=float, default=30.0)
    parser.add_argument("--eval-s", type=float, default=40.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--other-concurrency", type=int, default=4)
    parser.add_argument("--time-scale", type=float, default=20.0, help="MOTLEY_EMULATION_TIME_SCALE")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    demo = Demo(Path(tempfile.mkdtemp(prefix="calibration-bench-")), args.time_scale)
    try:
        started = time.monotonic()
        demo.start()
        print(f"demo up in {time.monotonic() - started:.0f} s ({demo.var})", file=sys.stderr)
        (deployment,) = demo.get("/api/v1/deployments/?name=demo")["results"]
        layers = {s["stage_key"]: _placement(s) for s in deployment["stages"] if s["wanted"]}

        def calibrated(body: dict) -> bool:
            """Every stage of the deployment observed and its device calibrated from measurements."""
            stages = body["stages"]
            return set(stages) == set(layers) and all(s["source"] == "measured" for s in stages.values())

        fit = asyncio.run(phase(demo, deployment["id"], args.concurrency, args.fit_s, until=calibrated))
        factors = {d["device"]: d for d in demo.get("/api/v1/plans/calibration/")["devices"]}
        print(f"fit: {len(fit)} observations; factors: "
              + ", ".join(f"{name} x{factors[name]['factor']:.1f}" for name in sorted(factors)
                          if factors[name]["source"] == "measured"), file=sys.stderr)
        loads = ((f"same load ({args.concurrency} requests at a time)", args.concurrency),
                 (f"other load ({args.other_concurrency} at a time)", args.other_concurrency))
        for title, concurrency in loads:
            observed = asyncio.run(phase(demo, deployment["id"], concurrency, args.eval_s))
            if observed:
                print_table(title, *summary(observed, layers), markdown=args.markdown)
            else:
                print(f"\n{title}: no observation", file=sys.stderr)
    finally:
        demo.stop()


def _placement(stage: dict) -> str:
    spec_layers = stage.get("layers") or []
    bits = stage.get("bits")
    low = f", {stage['low_bits']}-bit from {stage['low_from']}" if stage.get("low_bits") else ""
    return f"[{spec_layers[0]}, {spec_layers[1]}) {bits}-bit{low}" if spec_layers else ""


if __name__ == "__main__":
    main()
