"""worker_runtime depends on torch, safetensors, tokenizers, ZeroMQ (the stage-to-stage transport) and
the standard library only: never on the control plane, Django or Celery."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "worker_runtime"
ALLOWED_THIRD_PARTY = {"torch", "safetensors", "tokenizers", "zmq"}
FORBIDDEN = ("django", "celery", "controlplane", "agents", "rest_framework", "channels")


def test_modules_import_only_the_allowed_packages():
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = {node.module.split(".")[0]}
            else:
                continue
            outside = {r for r in roots if r not in sys.stdlib_module_names and r not in ALLOWED_THIRD_PARTY}
            assert not outside, f"{path.relative_to(REPO)} imports {outside}"


def test_importing_every_module_pulls_in_no_control_plane_code():
    modules = sorted(f"worker_runtime.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def test_the_config_module_stays_free_of_torch():
    code = "import sys, worker_runtime.config\nassert 'torch' not in sys.modules\n"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
