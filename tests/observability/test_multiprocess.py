"""Several processes, one scrape: each process records requests through the gateway's recorder into
``PROMETHEUS_MULTIPROC_DIR``, and ``/metrics`` (answered here, by a process that recorded none of
them) serves their sum; a process that exits takes its requests in flight out of the gauges, not its
counts out of the counters."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.observability.conftest import parse
from tests.support.processes import REPO_ROOT, embedded_env

pytestmark = pytest.mark.django_db

# One gateway process's traffic: DONE completed requests (10 prompt tokens, 5 generated, first token
# after 50 ms, 200 ms in all), RUNNING decoding and WAITING without a first token when it stops to wait.
RECORD = """
import sys, time
import django
django.setup()
from controlplane.gateway.serving.decision_log import RouteRecord, recorder
done, running, waiting = (int(a) for a in sys.argv[1:4])
def start(i):
    rid = f"{sys.argv[4]}-{i}"
    recorder.record(RouteRecord(rid, "demo", "cost_aware", time.time(), "d1-r0", "running", prompt_tokens=10))
    return rid
for i in range(done):
    rid = start(i)
    recorder.first_token(rid, 0.05)
    recorder.finished(rid, "completed", 0.2, 5)
for i in range(done, done + running):
    recorder.first_token(start(i), 0.05)
for i in range(done + running, done + running + waiting):
    start(i)
recorder.record(RouteRecord("x", "demo", "cost_aware", time.time(), None, "rejected:saturated"))
print("ready", flush=True)
sys.stdin.read()  # serve until the test closes stdin, then exit normally
"""


def gateway_process(env: dict, done: int, running: int, waiting: int, name: str) -> subprocess.Popen:
    argv = [sys.executable, "-c", RECORD, str(done), str(running), str(waiting), name]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_two_processes_counters_are_summed_and_live_gauges_follow_the_living(client, tmp_path, monkeypatch):
    env = embedded_env(tmp_path / "var")
    env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prometheus")  # created by the first process
    env["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    a = gateway_process(env, done=3, running=1, waiting=0, name="a")
    b = gateway_process(env, done=2, running=2, waiting=1, name="b")
    try:
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", env["PROMETHEUS_MULTIPROC_DIR"])
        s = parse(client.get("/metrics").content.decode())
        labels = {"model_name": "demo", "replica": "d1-r0"}
        assert s.value("vllm:prompt_tokens_total", **labels) == (3 + 1 + 2 + 2) * 10  # prefilled ones
        assert s.value("vllm:generation_tokens_total", **labels) == (3 + 2) * 5
        assert s.value("vllm:time_to_first_token_seconds_count", **labels) == 3 + 1 + 2 + 2
        assert s.value("vllm:time_to_first_token_seconds_bucket", le="0.06", **labels) == 8
        assert s.value("vllm:time_to_first_token_seconds_bucket", le="0.04", **labels) == 0
        assert s.value("vllm:e2e_request_latency_seconds_count", **labels) == 5
        assert s.value("vllm:e2e_request_latency_seconds_sum", **labels) == pytest.approx(1.0)
        assert s.value("vllm:inter_token_latency_seconds_count", **labels) == 5 * 4
        assert s.value("vllm:inter_token_latency_seconds_sum", **labels) == pytest.approx(5 * 0.15)
        assert s.value("vllm:num_requests_running", **labels) == 3
        assert s.value("vllm:num_requests_waiting", **labels) == 1
        assert s.value("motley_router_decisions_total", model_name="demo", replica="none", reason="saturated",
                       strategy="cost_aware") == 2
        a.stdin.close()
        assert a.wait(timeout=20) == 0
        s = parse(client.get("/metrics").content.decode())
        assert s.value("vllm:num_requests_running", **labels) == 2  # b's alone: a is gone
        assert s.value("vllm:prompt_tokens_total", **labels) == 80  # what a counted stays counted
    finally:
        for process in (a, b):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_run_local_empties_the_directory_before_the_processes_start(tmp_path, monkeypatch):
    from controlplane.ops.management.commands.run_local import metrics_env

    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "counter_123.db").write_bytes(b"left by the previous run")
    (folder / "gauge_livesum_123.db").write_bytes(b"a process long gone")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    assert metrics_env() == {"PROMETHEUS_MULTIPROC_DIR": str(folder)}
    assert list(folder.iterdir()) == []
