"""`make run`'s system for a benchmark: ``manage.py run_local`` on the embedded default, with its
admin API and its demo model's API key, stopped with everything it started.

Two allowances for CPU stages on a small host (``bench_env``). Concurrent ~700-token prefills share
the cores with every stage: a micro-batch's step lasts seconds, longer than the stages' default 5 s
before a silent peer breaks the pipeline (``peer_timeout_s``), or than the gateway's 5 s before a
silent head counts as a broken replica (``CLIENT_TIMEOUT_S``, the same figure: each such request is
resumed elsewhere and raises its replica's error rate, a slowdown of 5-8x in the router's eyes). And
the gateway keeps each replica's planned costs unless ``calibrate``: measured on CPU stages, step
times of seconds full of prefill make a decode step cost seconds (a factor of 130 from the first 3
samples of one replica), so the router expects no request to finish within its deadline and refuses
most with 429.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_check_serve import REPO, Launcher, embedded_env, free_port, wait_ready  # noqa: E402
from benchmarks.replacement_bench import Api  # noqa: E402


@dataclass(frozen=True)
class DemoSystem:
    base: str  # http://127.0.0.1:<port>
    key: str  # the demo model's OpenAI API key
    api: Api  # the REST API as the generated admin
    pk: int  # the demo deployment
    model: str  # its served model name


def bench_env(work: Path, var: Path, *, peer_timeout_s: float, calibrate: bool = False) -> dict[str, str]:
    """``make run``'s embedded environment with the allowances above, through a settings module
    written into ``work`` (the gateway's settings are a dict in the settings, not variables)."""
    env = embedded_env(var) | {"MOTLEY_STAGE_PEER_TIMEOUT_S": str(peer_timeout_s)}
    gateway: dict[str, float] = {"CLIENT_TIMEOUT_S": peer_timeout_s}
    if not calibrate:
        gateway["COSTS_MIN_SAMPLES"] = 1000
    (work / "bench_settings.py").write_text(
        "from controlplane.settings import *  # noqa: F403\n"
        f"MOTLEY_GATEWAY = {{**MOTLEY_GATEWAY, **{gateway!r}}}  # noqa: F405\n")
    path = [str(work), str(REPO), *filter(None, [env.get("PYTHONPATH")])]
    return env | {"DJANGO_SETTINGS_MODULE": "bench_settings", "PYTHONPATH": ":".join(path)}


@contextmanager
def demo_system(work: Path, *, peer_timeout_s: float, calibrate: bool = False) -> Iterator[DemoSystem]:
    """Migrate, start ``run_local`` and wait for its demo deployment to serve; stop it all after."""
    work = work.resolve()
    var = work / "var"
    var.mkdir(parents=True, exist_ok=True)
    env = bench_env(work, var, peer_timeout_s=peer_timeout_s, calibrate=calibrate)
    manage = [sys.executable, str(REPO / "manage.py")]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=env, cwd=REPO, check=True, timeout=300)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    launcher = Launcher([*manage, "run_local", "--port", str(port)], env, work / "run_local.log")
    try:
        key = wait_ready(launcher, var / "demo-api-key.txt", time.monotonic() + 900)
        lines = (var / "admin-credentials.txt").read_text().splitlines()
        api = Api(base, dict(line.split(": ", 1) for line in lines)["api_token"])
        deployment = api.deployment()
        yield DemoSystem(base, key, api, deployment["id"], deployment["model_name"])
    finally:
        launcher.stop()
