"""The GPU check's plumbing, so it cannot rot between lent GPU machines: its dry run on the CPU (the
stand-in NVML, the CUDA tests skipping, runtime_bench on a tiny model, `run_local` with an emulated
device answering a chat request), a failing step's exit code, the wheelhouse's selection and install,
the docs' GPU section, and run_local's --no-emulate path as far as a host without GPUs can go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_check_env, gpu_check_report
from tests.support.processes import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.py"
STEPS = ["env", "nvml", "cuda-tests", "bench", "serve", "tp"]
SERVICE_VARIABLES = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CHANNEL_REDIS_URL",
    "DJANGO_SETTINGS_MODULE",
    "OUT",
)


def gpu_check(tmp_path: Path, *args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess, dict]:
    """The check as a person runs it, with its results and scratch folders under ``tmp_path``; no
    wheelhouse (the suite's Python has every package)."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_VARIABLES}
    argv = [
        sys.executable,
        str(SCRIPT),
        "--dry-run",
        "--results",
        str(tmp_path / "results"),
        "--work",
        str(tmp_path / "work"),
        "--wheelhouse",
        str(tmp_path / "no-wheelhouse"),
        *args,
    ]
    done = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    summary = json.loads((tmp_path / "results" / "summary.json").read_text())
    return done, summary


@pytest.mark.slow
@pytest.mark.timeout(540)
def test_the_dry_run_passes_every_step_and_reports_each(tmp_path):
    # 80 s alone; on two cores the suite's other workers load, the default 240 s ran out before serve.
    done, summary = gpu_check(tmp_path, "--budget", "480", timeout_s=520)
    statuses = {s["name"]: s["status"] for s in summary["steps"]}
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert list(statuses) == STEPS
    assert set(statuses.values()) == {"passed"}, summary["steps"]
    steps = {s["name"]: s for s in summary["steps"]}
    assert steps["nvml"]["result"]["fake"] and len(steps["nvml"]["result"]["devices"]) == 3
    assert steps["nvml"]["result"]["metrics"][2]["throttle_reasons"] == ["hw_thermal"]
    assert "skipped" in steps["cuda-tests"]["detail"]  # no CUDA here: the CUDA tests skip cleanly
    bench = steps["bench"]["result"]
    assert bench["device"] == "cpu" and set(bench["engines"]) >= {
        "transformers fp32",
        "motley int8",
        "motley int4",
    }
    tp = steps["tp"]["result"]  # the two-GPU step's plumbing: two CPU ranks over gloo, no GPU needed
    assert tp["device"] == "cpu" and len(tp["shares"]) == 2 and tp["max_abs_error"] < 1e-4
    assert steps["tp"]["log"] == "3-bench.log" and "decode" in steps["tp"]["detail"]
    serve = steps["serve"]["result"]
    assert serve["chat"]["status"] == 200 and serve["devices"][0]["emulated"] and not serve["left_running"]
    assert serve["telemetry"]["device"] and serve["telemetry"]["stage"]
    # What the device tool brings back: at most 8 files, named plainly, one folder down at most.
    files = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(files) <= 8 and files == [
        "0-env.log",
        "1-nvml.log",
        "2-cuda-tests.log",
        "3-bench.log",
        "4-serve.log",
        "details.tar.gz",
        "summary.json",
        "summary.md",
    ]
    markdown = (tmp_path / "results" / "summary.md").read_text()
    assert all(f"| {name} | passed |" in markdown for name in STEPS) and "Goals:" in markdown
    assert "| step | status |" in done.stdout  # the summary is printed last


@pytest.mark.parametrize("step", ["nvml", "env"])
def test_a_failing_step_makes_the_exit_code_non_zero(tmp_path, step):
    done, summary = gpu_check(tmp_path, "--only", "nvml", "--fail", step, timeout_s=120)
    statuses = {s["name"]: (s["status"], s["detail"]) for s in summary["steps"]}
    assert done.returncode == 1, done.stdout + done.stderr
    assert list(statuses) == STEPS
    assert statuses[step] == ("failed", statuses[step][1]) and "injected" in statuses[step][1]
    assert statuses["bench"] == ("skipped", "not selected (--only)")
    assert f"FAILED: {step}" in done.stdout


def _wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel holding one module, ``<name>_module``."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name}_module.py", "VALUE = 42\n")
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def test_the_wheelhouse_installs_only_what_the_python_lacks_and_once(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "Django", "0.0.1")  # the suite's Python has Django: never installed over it
    _wheel(wheels, "motley_gpu_check_probe")
    assert gpu_check_env.distribution_of(wheels / "Django-0.0.1-py3-none-any.whl") == "django"
    assert [w.name for w in gpu_check_env.missing_wheels(sys.executable, wheels)] == [
        "motley_gpu_check_probe-1.0-py3-none-any.whl"
    ]
    site, lines = tmp_path / "site", []
    installed, needed = gpu_check_env.install_missing(sys.executable, wheels, site, lines.append, 120)
    assert installed == ["motley_gpu_check_probe-1.0-py3-none-any.whl"] and needed
    assert (site / "motley_gpu_check_probe_module.py").exists() and not (site / "django").exists()
    again, needed = gpu_check_env.install_missing(sys.executable, wheels, site, lines.append, 120)
    assert again == [] and needed  # a warm machine keeps the site: nothing to install the second time
    probe = gpu_check_env.probe_python(sys.executable, [site])
    assert probe["modules"]["django"] and "torch" in probe


def test_the_wheelhouse_carries_the_requirements_the_device_image_lacks():
    wanted = {line.split("==")[0].lower() for line in gpu_check_env.wheelhouse_requirements()}
    assert {"django", "celery", "daphne", "pyzmq", "plotly", "redis", "pytest-django"} <= wanted
    assert not wanted & {"torch", "numpy", "safetensors", "transformers", "nvidia-ml-py"}


def test_fill_docs_puts_a_summary_between_the_markers(tmp_path):
    docs, summary = tmp_path / "benchmarks.md", tmp_path / "summary.md"
    begin, end = "<!-- gpu-check: begin -->", "<!-- gpu-check: end -->"
    docs.write_text(f"# B\n\n## GPU\n\n{begin}\nno GPU run yet\n{end}\n\n## Next\n")
    summary.write_text("#### GPU check of today\n\n| step | status |\n")
    assert gpu_check_report.fill_docs(summary, docs, (begin, end)) == 0
    text = docs.read_text()
    assert (
        "no GPU run yet" not in text
        and f"{begin}\n#### GPU check of today" in text
        and text.endswith("## Next\n")
    )
    assert begin in (REPO_ROOT / "docs" / "benchmarks.md").read_text()  # the real docs have the section


@pytest.mark.django_db
def test_run_local_on_this_hosts_gpus_starts_one_agent_without_a_fleet_file(tmp_path):
    from controlplane.inventory.models import Node
    from controlplane.ops import demo

    prepared = demo.demo_fleet_prepare(fleet_file=None)
    name = demo.local_node_name()
    assert prepared.fleet is None and prepared.incarnations == {name: 0} and not Node.objects.exists()
    argv = demo.agent_argv(server="http://127.0.0.1:1", fleet_file=None, node=name)
    assert argv[-2:] == ["--name", name] and "--emulate" not in argv
    emulated = demo.agent_argv(server="http://127.0.0.1:1", fleet_file=tmp_path / "f.yaml", node="n0")
    assert emulated[-4:] == ["--emulate", str(tmp_path / "f.yaml"), "--node", "n0"]
    # An agent with no GPU and no fleet file refuses to start (exit 2), as docs/agents.md says.
    done = subprocess.run(
        [
            *argv[:-4],
            "--server",
            "http://127.0.0.1:1",
            "--join-token",
            "mjt_x",
            "--name",
            name,
            "--state-dir",
            str(tmp_path / "agent"),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
