"""The prepared GPU check: one command that proves motley's CUDA and NVML paths on a lent GPU machine.

    python3 benchmarks/gpu_check.py [--results DIR] [--only STEP ...] [--budget 480]   # on a GPU host
    .venv/bin/python benchmarks/gpu_check.py --dry-run                                 # the plumbing, on CPU
    .venv/bin/python benchmarks/gpu_check.py --fetch-wheels         # here, before a device run (PyPI)
    .venv/bin/python benchmarks/gpu_check.py --fill-docs DIR        # a run's summary into docs/benchmarks.md

Steps, each in its own process with its own time limit and log (docs/benchmarks.md, "GPU"):
  env         the Python that runs the rest (CUDA torch; a venv from requirements-dev.txt where none
              has it and PyPI is reachable), the wheelhouse's missing packages installed, timed
  nvml        NVML discovery through the agent's code (benchmarks/gpu_check_nvml.py)
  cuda-tests  tests/worker_runtime/test_cuda.py (parity with transformers on cuda at fp16/bf16, int8,
              int4) and tests/agents/test_nvml_discovery.py (the real-NVML test)
  bench       benchmarks/runtime_bench.py on cuda: decode at batch 1/16/64, weight-read GB/s against
              the copy bandwidth measured in the same run (demo model; SmolLM2 with --smollm2 DIR)
  serve       `run_local --no-emulate`: a local agent on this GPU serving the demo model, a chat
              request through the gateway, its telemetry in the API (benchmarks/gpu_check_serve.py)
  tp          benchmarks/tp_runtime_bench.py --device cuda: a stage split 5/8 : 3/8 over cuda:0 and
              cuda:1 (NCCL) against the same stage on cuda:0, step times and the error; skipped (saying why)
              with fewer than two GPUs; the dry run runs it on CPU over gloo; its log is bench's
Results go to --results (default $OUT when set, else var/gpu-check/<time>): one log per step
(tp appends to bench's), summary.json, summary.md (the docs' GPU section) and details.tar.gz (the
work folder's logs): eight files, what the device tool brings back. Exit 1 when a step failed; a
skipped step says why.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_check_env as environment  # noqa: E402
from gpu_check_report import fill_docs, step_detail, summary_markdown, write_details  # noqa: E402

REPO = environment.REPO
BENCH = Path(__file__).resolve().parent
WHEELHOUSE = REPO / "var" / "wheelhouse"
SITE = Path(tempfile.gettempdir()) / "motley-gpu-site"  # kept between calls on a warm device machine
DOCS = REPO / "docs" / "benchmarks.md"
MARKERS = ("<!-- gpu-check: begin -->", "<!-- gpu-check: end -->")
TINY_MODEL = ["--layers", "2", "--hidden", "128", "--intermediate", "256", "--heads", "4", "--kv-heads", "2"]


@dataclass
class Run:
    args: argparse.Namespace
    work: Path
    results: Path
    python: str = ""
    paths: list[Path] = field(default_factory=list)  # first on PYTHONPATH (the installed wheelhouse)
    missing: dict[str, list[str]] = field(default_factory=dict)  # step -> modules its Python lacks
    deadline: float = 0.0

    @property
    def dry(self) -> bool:
        return self.args.dry_run

    def env(self, **extra: str) -> dict[str, str]:
        return {**environment.with_pythonpath(os.environ, self.paths), "PYTHONUNBUFFERED": "1", **extra}


@dataclass
class Step:
    name: str
    title: str
    timeout_s: float  # on a GPU machine; the dry run gives each step at most DRY_TIMEOUT_S
    commands: object  # (Run) -> list of argv
    result: str = ""  # a JSON file the step writes into the work folder, kept in summary.json
    log: str = ""  # another step whose log this one appends to (the device tool brings back 8 files)
    may_skip: bool = False  # its GPU-CHECK-SKIP stands on a GPU machine too (it needs what one may lack)


DRY_TIMEOUT_S = 150


def model_commands(run: Run) -> list[list[str]]:
    model = run.work / "demo-model"
    if (model / "config.json").exists():
        return []
    return [
        [run.python, "-m", "worker_runtime.make_demo_model", str(model), *(TINY_MODEL if run.dry else [])]
    ]


def nvml_commands(run: Run) -> list[list[str]]:
    fake = ["--fake"] if run.dry else []
    return [[run.python, str(BENCH / "gpu_check_nvml.py"), *fake, "--json", str(run.work / "nvml.json")]]


def test_commands(run: Run) -> list[list[str]]:
    return [
        [
            run.python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-v",
            "-s",
            "-rs",
            "tests/worker_runtime/test_cuda.py",
            "tests/agents/test_nvml_discovery.py",
            f"--junitxml={run.work / 'cuda-tests.xml'}",
        ]
    ]


DRY_BENCH = "--device cpu --batches 1 2 --rounds 1 --tokens 8 --prefill-len 16 --copy-mib 64"
GPU_BENCH = "--device cuda --batches 1 16 64 --rounds 3 --tokens 32"


def bench_commands(run: Run) -> list[list[str]]:
    bench = [run.python, str(BENCH / "runtime_bench.py"), *(DRY_BENCH if run.dry else GPU_BENCH).split()]
    demo = [*bench, "--model", str(run.work / "demo-model"), "--json", str(run.work / "bench-demo.json")]
    commands = [*model_commands(run), demo]
    if run.args.smollm2 and (run.args.smollm2 / "config.json").exists():
        commands.append(
            [*bench, "--model", str(run.args.smollm2), "--json", str(run.work / "bench-smollm2.json")]
        )
    return commands


def serve_commands(run: Run) -> list[list[str]]:
    left = max(30.0, run.deadline - time.monotonic() - 20)
    serve = [run.python, str(BENCH / "gpu_check_serve.py"), "--work", str(run.work / "serve")]
    serve += ["--model", str(run.work / "demo-model"), "--json", str(run.work / "serve.json"), "--timeout"]
    return [*model_commands(run), [*serve, f"{left:.0f}", *(["--emulate"] if run.dry else [])]]


DRY_TP = "--device cpu --prompt 16 --decode 4 --repeats 1 --time-scale 0"


def tp_commands(run: Run) -> list[list[str]]:
    tp = [run.python, str(BENCH / "tp_runtime_bench.py"), *(DRY_TP if run.dry else "--device cuda").split()]
    tp += ["--model", str(run.work / "demo-model"), "--json", str(run.work / "tp.json")]
    return [*model_commands(run), tp]


STEPS = [
    Step("nvml", "NVML discovery (agent code)", 60, nvml_commands, "nvml.json"),
    Step("cuda-tests", "CUDA tests + parity vs transformers", 240, test_commands),
    Step("bench", "runtime_bench on cuda", 300, bench_commands, "bench-demo.json"),
    Step("serve", "run_local --no-emulate + chat + telemetry", 300, serve_commands, "serve.json"),
    Step("tp", "two-GPU tensor-parallel stage (NCCL) vs one GPU", 180, tp_commands, "tp.json", log="bench",
         may_skip=True),
]
ALL = ["env", *(s.name for s in STEPS)]


def env_step(run: Run, log_path: Path) -> dict:
    with log_path.open("w") as log:
        try:
            ready = environment.prepare(
                run.args, run.work, lambda text: (log.write(text.rstrip() + "\n"), log.flush())
            )
        except (environment.EnvironmentProblem, subprocess.SubprocessError, OSError) as problem:
            return {"status": "failed", "detail": str(problem), "result": {}}
    run.python, run.paths, run.missing = ready.python, ready.paths, ready.missing
    if run.args.fail == "env":
        return {"status": "failed", "detail": "failure injected into env (--fail)", "result": ready.info}
    return {"status": "passed", "detail": ready.detail, "result": ready.info}


def run_commands(run: Run, step: Step, log_path: Path, timeout_s: float) -> tuple[int | None, str]:
    """Run the step's commands in order into one log; (exit code, None on time-out) and the step's output
    (what it added to the log)."""
    deadline = time.monotonic() + timeout_s
    offset = log_path.stat().st_size if log_path.exists() else 0
    # tests/conftest.py overrides Django settings around every test: name them, with or without pytest-django.
    parity = str(run.work / "parity.jsonl")
    env = run.env(MOTLEY_PARITY_RECORD=parity, DJANGO_SETTINGS_MODULE="controlplane.settings")
    with log_path.open("a") as log:
        commands = step.commands(run)
        if step.name == run.args.fail:
            commands = [[run.python, "-c", f"raise SystemExit('failure injected into {step.name} (--fail)')"]]
        for argv in commands:
            log.write(f"$ {' '.join(argv)}\n")
            log.flush()
            child = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code = child.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGTERM)  # the serve step stops its launcher on TERM
                try:
                    child.wait(timeout=45)
                except subprocess.TimeoutExpired:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                return None, _read_from(log_path, offset)
            if code != 0:
                return code, _read_from(log_path, offset)
    return 0, _read_from(log_path, offset)


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def judge(run: Run, step: Step, code: int | None, output: str, timeout_s: float) -> tuple[str, str]:
    """A step's status and one line about it, from its exit code, its output and its result file."""
    if code is None:
        return "failed", f"timed out after {timeout_s:.0f} s"
    if skip := re.search(r"GPU-CHECK-SKIP: (.*)", output):
        return ("skipped" if run.dry or step.may_skip else "failed"), skip[1]  # NVML must see a GPU
    if step.name == "cuda-tests":
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", output[-600:])}
        detail = ", ".join(f"{n} {k}" for k, n in counts.items())
        if code == 0 and counts.get("skipped") and not run.dry:
            return "failed", f"{detail}: tests skipped on a GPU machine check nothing"
        return ("passed" if code == 0 else "failed"), detail
    if code != 0:
        return "failed", f"exit {code}: " + (output.strip().splitlines() or ["no output"])[-1][:200]
    return "passed", step_detail(step.name, load(run.work / step.result) if step.result else {})


def load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.fetch_wheels:
        return environment.fetch_wheels(args.fetch_wheels)
    if args.fill_docs:
        return fill_docs(args.fill_docs / "summary.md", DOCS, MARKERS)
    stamp = datetime.now(UTC)
    results = args.results or (
        Path(os.environ["OUT"])
        if os.environ.get("OUT")
        else REPO / "var" / "gpu-check" / stamp.strftime("%Y%m%d-%H%M%S")
    )
    results.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="motley-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args, work, results, deadline=time.monotonic() + args.budget)
    summary = {
        "started": stamp.isoformat(timespec="seconds"),
        "host": platform.node(),
        "dry_run": args.dry_run,
        "budget_s": args.budget,
        "work": str(work),
        "steps": [],
    }
    for name in ALL:
        step = next((s for s in STEPS if s.name == name), None)
        shared = step.log if step and step.log else name
        log_path = results / f"{ALL.index(shared)}-{shared}.log"
        entry = {"name": name, "title": step.title if step else "environment", "log": log_path.name}
        started, left = time.monotonic(), run.deadline - time.monotonic()
        if args.only and name not in args.only and name != "env":
            entry |= {"status": "skipped", "detail": "not selected (--only)"}
        elif name != "env" and not run.python:
            entry |= {"status": "skipped", "detail": "no Python to run it (see the env step)"}
        elif name != "env" and run.missing.get(name):
            entry |= {
                "status": "skipped",
                "detail": f"missing {', '.join(run.missing[name])} (carry var/wheelhouse)",
            }
        elif left < 20:
            entry |= {"status": "skipped", "detail": f"out of time (--budget {args.budget:.0f} s)"}
        elif step is None:
            entry |= env_step(run, log_path)
        else:
            timeout_s = min(step.timeout_s, DRY_TIMEOUT_S if run.dry else step.timeout_s, left - 15)
            code, output = run_commands(run, step, log_path, timeout_s)
            entry |= dict(zip(("status", "detail"), judge(run, step, code, output, timeout_s)))
            entry["result"] = load(work / step.result) if step.result else {}
        entry["seconds"] = round(time.monotonic() - started, 1)
        print(f"[{entry['seconds']:6.1f} s] {name}: {entry['status']}: {entry['detail']}", flush=True)
        summary["steps"].append(entry)
    summary["parity"] = (
        [json.loads(line) for line in (work / "parity.jsonl").read_text().splitlines() if line.strip()]
        if (work / "parity.jsonl").exists()
        else []
    )
    summary["smollm2"] = load(work / "bench-smollm2.json") or {
        "skipped": (
            "no SmolLM2 checkpoint in Hugging Face format given (--smollm2 DIR): "
            "motley cannot import it from GGUF yet"
        )
    }
    markdown = summary_markdown(summary)
    (results / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (results / "summary.md").write_text(markdown)
    write_details(work, results / "details.tar.gz")
    print("\n" + markdown)
    failed = [s["name"] for s in summary["steps"] if s["status"] == "failed"]
    print(f"results in {results}" + (f"; FAILED: {', '.join(failed)}" if failed else "; no step failed"))
    if not args.keep_work and args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU: stand-in NVML, tiny sizes, emulated serving"
    )
    parser.add_argument(
        "--results", type=Path, help="results folder (default: $OUT, else var/gpu-check/<time>)"
    )
    parser.add_argument(
        "--work", type=Path, help="scratch folder (default: a new temporary one, removed after)"
    )
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary scratch folder")
    parser.add_argument(
        "--python", help="the Python that runs the steps (default: the first with CUDA torch)"
    )
    parser.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE, help="wheels to install where missing")
    parser.add_argument("--site", type=Path, default=SITE, help=f"where missing wheels go (default {SITE})")
    parser.add_argument(
        "--smollm2", type=Path, help="a SmolLM2 checkpoint in Hugging Face format to bench too"
    )
    parser.add_argument("--only", nargs="+", choices=ALL, help="run only these steps (env always runs)")
    parser.add_argument("--budget", type=float, help="seconds for all steps (default 480; dry run 240)")
    parser.add_argument("--fail", choices=ALL, help="make this step fail (to test the exit code)")
    parser.add_argument(
        "--fetch-wheels",
        type=Path,
        nargs="?",
        const=WHEELHOUSE,
        metavar="DIR",
        help=f"download the wheels the device image lacks (default {WHEELHOUSE.relative_to(REPO)})",
    )
    parser.add_argument(
        "--fill-docs", type=Path, metavar="RESULTS", help="put RESULTS/summary.md into the docs"
    )
    args = parser.parse_args(argv)
    args.budget = args.budget or (240.0 if args.dry_run else 480.0)
    return args


if __name__ == "__main__":
    sys.exit(main())
