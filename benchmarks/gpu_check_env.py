"""The environment of the GPU check: which Python runs the steps, and the packages it lacks.

Standard library only, so it runs under any ``python3``. A lent GPU machine has no package index: its
``python3`` already holds a CUDA build of torch (not the pinned version), transformers, pytest,
nvidia-ml-py and more, but not the control plane's packages (Django, Celery, Channels, daphne, pyzmq,
plotly, ...). Those travel as wheels: ``fetch_wheels`` downloads them here (where PyPI is reachable)
into a folder that git ignores and the device tool carries; ``install_missing`` installs, there, only
the distributions the chosen Python lacks, into a folder put first on ``PYTHONPATH``. Where no Python
has CUDA torch and an index is reachable, ``make_cuda_venv`` builds a venv from requirements-dev.txt
(PyPI's torch for Linux x86_64 is the CUDA build) and the check records how long that took.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The runtime requirements the device image has already (KINDS.md's package list of nvidia-h200), in
# other versions: not carried. Every other line of requirements.txt is, at its pin, with pytest-django
# of requirements-dev.txt (tests/conftest.py overrides Django settings around every test, the CUDA
# ones too). Their dependencies come along; those the image has are not installed there.
ON_THE_IMAGE = {
    "torch",
    "numpy",
    "safetensors",
    "tokenizers",
    "psutil",
    "httpx",
    "pyyaml",
    "jinja2",
    "nvidia-ml-py",
}
DEV_CARRIED = {"pytest-django"}
PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_27_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "manylinux1_x86_64",
]
# What each step imports (module names), checked before the step runs.
STEP_MODULES = {
    "nvml": ("pynvml", "yaml"),
    "cuda-tests": (
        "torch",
        "pytest",
        "pytest_timeout",
        "transformers",
        "safetensors",
        "tokenizers",
        "pynvml",
        "psutil",
    ),
    "bench": ("torch", "transformers", "safetensors", "tokenizers"),
    "serve": (
        "torch",
        "safetensors",
        "tokenizers",
        "django",
        "rest_framework",
        "drf_spectacular",
        "drf_spectacular_sidecar",
        "django_filters",
        "dj_database_url",
        "celery",
        "kombu",
        "channels",
        "daphne",
        "zmq",
        "plotly",
        "websockets",
        "httpx",
        "yaml",
        "psutil",
        "pynvml",
        "jinja2",
    ),
}
PROBE = r"""
import importlib.util, json, sys
found = {m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}
info = {"python": sys.version.split()[0], "executable": sys.executable, "modules": found}
try:
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cuda_available"] = torch.cuda.is_available()
    if info["cuda_available"]:
        info["gpu"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
except Exception as exc:  # no torch, or a broken one: the caller reports it
    info["torch_error"] = repr(exc)
print(json.dumps(info))
"""


class EnvironmentProblem(RuntimeError):
    """No Python that can run the steps, and no way to make one here."""


def probe_python(python: str, extra_paths: list[Path] = (), timeout_s: float = 120) -> dict:
    """What ``python`` has: the steps' modules (found, not imported) and torch with its CUDA status."""
    modules = sorted({m for ms in STEP_MODULES.values() for m in ms})
    done = subprocess.run(
        [python, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=with_pythonpath(os.environ, list(extra_paths)),
    )
    if done.returncode != 0:
        raise EnvironmentProblem(f"{python} could not be probed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_pythonpath(env: os._Environ | dict, extra: list[Path]) -> dict[str, str]:
    """``env`` with the repository (and ``extra`` folders) first on PYTHONPATH."""
    paths = (
        [str(p) for p in extra] + [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    return {**env, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


def candidates(explicit: str | None) -> list[str]:
    if explicit:
        return [explicit]
    found = [sys.executable, str(REPO / ".venv" / "bin" / "python"), shutil.which("python3") or ""]
    return [p for p in dict.fromkeys(found) if p and Path(p).exists()]


def choose_python(explicit: str | None, need_cuda: bool, log) -> tuple[str, dict]:
    """The first candidate with torch (with CUDA, when ``need_cuda``); EnvironmentProblem if none."""
    seen = []
    for python in candidates(explicit):
        try:
            info = probe_python(python)
        except (EnvironmentProblem, subprocess.TimeoutExpired, OSError) as exc:
            log(f"{python}: {exc}")
            continue
        log(f"{python}: {json.dumps(info)}")
        seen.append(python)
        if "torch" in info and (info.get("cuda_available") or not need_cuda):
            return python, info
    wanted = "torch with CUDA" if need_cuda else "torch"
    raise EnvironmentProblem(f"no Python with {wanted} among {seen or candidates(explicit)}")


def index_reachable(host: str = "pypi.org", timeout_s: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def make_cuda_venv(folder: Path, log, timeout_s: float) -> tuple[str, float]:
    """A venv with requirements-dev.txt from PyPI (CUDA torch on Linux x86_64); returns (python, seconds)."""
    if not index_reachable():
        raise EnvironmentProblem("no Python here has CUDA torch and no package index is reachable to get it")
    started = time.monotonic()
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=120)
    pip = [str(python), "-m", "pip", "install", "-q", "-r", str(REPO / "requirements-dev.txt")]
    log("$ " + " ".join(pip))
    left = max(30.0, timeout_s - (time.monotonic() - started))
    done = subprocess.run(pip, capture_output=True, text=True, timeout=left)
    log(done.stdout[-3000:] + done.stderr[-3000:])
    if done.returncode != 0:
        raise EnvironmentProblem(f"pip install -r requirements-dev.txt failed (exit {done.returncode})")
    return str(python), time.monotonic() - started


def distribution_of(wheel: Path) -> str:
    """The normalized distribution name of a wheel file (PEP 503: lower case, runs of -_. as one -)."""
    return re.sub(r"[-_.]+", "-", wheel.name.split("-", 1)[0]).lower()


INSTALLED = (
    "import importlib.metadata as m, json, re;"
    "print(json.dumps(sorted({re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()"
    " for d in m.distributions() if d.metadata['Name']})))"
)


def missing_wheels(python: str, wheel_dir: Path, site: Path | None = None) -> list[Path]:
    """The wheels in ``wheel_dir`` whose distribution ``python`` lacks (also in ``site``, if given)."""
    env = with_pythonpath(os.environ, [site] if site else [])
    done = subprocess.run(
        [python, "-c", INSTALLED], capture_output=True, text=True, check=True, timeout=120, env=env
    )
    installed = set(json.loads(done.stdout))
    return [w for w in sorted(wheel_dir.glob("*.whl")) if distribution_of(w) not in installed]


def install_missing(
    python: str, wheel_dir: Path, site: Path, log, timeout_s: float
) -> tuple[list[str], bool]:
    """Install (without an index, without their dependencies) the wheels ``python`` lacks into ``site``
    (a previous run's installs there count); returns the wheels installed now and whether ``python``
    needs ``site`` on its path."""
    lacking = missing_wheels(python, wheel_dir)
    wheels = missing_wheels(python, wheel_dir, site) if lacking else []
    names = [w.name for w in wheels]
    total = len(list(wheel_dir.glob("*.whl")))
    log(f"wheelhouse {wheel_dir}: {len(lacking)} of {total} missing here, {len(names)} not yet in {site}")
    if not wheels:
        return names, bool(lacking)
    site.mkdir(parents=True, exist_ok=True)
    argv = [
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
        *map(str, wheels),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    log(done.stdout[-3000:] + done.stderr[-3000:])
    if done.returncode != 0:
        raise EnvironmentProblem(f"installing the wheelhouse failed (exit {done.returncode})")
    return names, True


def wheelhouse_requirements() -> list[str]:
    """``name==version`` of each requirement the device image lacks, as the requirement files pin it."""
    wanted = []
    for requirements, keep in (("requirements.txt", None), ("requirements-dev.txt", DEV_CARRIED)):
        for line in (REPO / requirements).read_text().splitlines():
            if "==" not in line or line.startswith("#"):
                continue
            name = re.sub(r"\[.*\]", "", line.split("==", 1)[0]).strip().lower()
            if name not in ON_THE_IMAGE and (keep is None or name in keep):
                wanted.append(line.strip())
    return wanted


def fetch_wheels(dest: Path, python_version: str = "3.12") -> int:
    """Download (here, with an index) the wheels the device image lacks, for its CPython 3.12 on x86-64."""
    dest.mkdir(parents=True, exist_ok=True)
    flags = [
        f.replace("3.12", python_version).replace("cp312", "cp" + python_version.replace(".", ""))
        for f in PLATFORM_FLAGS
    ]
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        *flags,
        "-d",
        str(dest),
        *wheelhouse_requirements(),
    ]
    print("$ " + " ".join(argv), flush=True)
    code = subprocess.run(argv).returncode
    size = sum(w.stat().st_size for w in dest.glob("*.whl"))
    print(f"{len(list(dest.glob('*.whl')))} wheels, {size / 2**20:.1f} MiB in {dest}")
    return code


@dataclass
class Prepared:
    python: str
    paths: list[Path] = field(default_factory=list)  # first on PYTHONPATH: the installed wheelhouse
    missing: dict[str, list[str]] = field(default_factory=dict)  # step -> modules its Python lacks
    detail: str = ""
    info: dict = field(default_factory=dict)


def prepare(args, work: Path, log) -> Prepared:
    """The env step: pick (or make) the Python, install what it lacks from the wheelhouse; timed."""
    info: dict = {}
    if smi := shutil.which("nvidia-smi"):
        query = "name,driver_version,memory.total,pstate,clocks.sm,clocks.mem,temperature.gpu,power.draw"
        done = subprocess.run([smi, f"--query-gpu={query}", "--format=csv"], capture_output=True, text=True)
        log(done.stdout + done.stderr)
        info["nvidia_smi"] = done.stdout.strip()
    try:
        python, info["probe"] = choose_python(args.python, not args.dry_run, log)
    except EnvironmentProblem as problem:
        if args.dry_run:
            raise
        log(f"{problem}; making a venv from requirements-dev.txt")
        python, seconds = make_cuda_venv(work / "venv", log, 900)
        info["venv_seconds"] = round(seconds, 1)
    ready = Prepared(python)
    if args.wheelhouse.is_dir():
        started = time.monotonic()
        info["wheels"], needed = install_missing(python, args.wheelhouse, args.site, log, 180)
        info["wheel_seconds"] = round(time.monotonic() - started, 1)
        ready.paths = [args.site] if needed else []
    probe = info["probe"] = probe_python(python, ready.paths)
    ready.missing = {
        step: [m for m in modules if not probe["modules"].get(m)] for step, modules in STEP_MODULES.items()
    }
    gpu = f"CUDA {probe.get('torch_cuda')}, {probe.get('gpu', 'no GPU')}"
    ready.detail = f"{python}: Python {probe['python']}, torch {probe.get('torch')} ({gpu})"
    if "wheels" in info:
        ready.detail += f"; {len(info['wheels'])} wheels installed ({info['wheel_seconds']} s)"
        ready.detail += f", {args.site} on PYTHONPATH" if ready.paths else ""
    if "venv_seconds" in info:
        ready.detail += f"; venv made in {info['venv_seconds']} s"
    if lacking := sorted({m for ms in ready.missing.values() for m in ms}):
        ready.detail += f"; missing: {', '.join(lacking)}"
    ready.info = info
    return ready
