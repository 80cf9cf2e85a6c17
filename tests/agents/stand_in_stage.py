"""A stand-in for ``python -m worker_runtime.serve`` that follows contracts §1 without a model.

It reads the spec, prints ``ready`` and then ``stats`` lines on stdout, drains and exits 0 on SIGTERM,
exits 0 at once on SIGUSR1 (replaced).
The spec's ``auth_token``, a JSON object here (tests/agents/helpers.py ``stage_spec``), scripts
misbehaviour for supervision tests:
``crash_after_s`` + ``exit_code`` (+ ``error``: an error event first), ``ignore_sigterm``,
``spawn_child`` (a grandchild in the same process group), ``steps_per_s`` and ``step_ms``,
``ready_when`` (a path: "loads" until it exists, then prints ``ready``), ``health`` (a head's health
events, each ``{"after_s", "ok", "broken_stage"}``, printed that long after ``ready``).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def emit(**event):
    print(json.dumps(event), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    spec = json.load(open(parser.parse_args().spec))
    try:
        script = json.loads(spec["auth_token"])
    except ValueError:
        script = {}
    script = script if isinstance(script, dict) else {}
    stopping = []
    if script.get("ignore_sigterm"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: os._exit(0))  # replaced: at once, as a real stage (serve.py)
    if script.get("spawn_child"):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    while script.get("ready_when") and not os.path.exists(script["ready_when"]) and not stopping:
        time.sleep(0.05)
    emit(event="ready", pipeline_id=spec["pipeline_id"], stage_index=spec["stage_index"], pid=os.getpid(),
         weight_bytes=1000, kv_bytes=2000, kv_tokens=spec.get("kv_tokens", 0))
    print(f"stand-in stage {spec['pipeline_id']}/{spec['stage_index']} on {spec['device']}", file=sys.stderr)
    started, steps, interval = time.monotonic(), 0, 0.2
    health = list(script.get("health", ()))
    while not stopping:
        time.sleep(interval)
        while health and time.monotonic() - started >= health[0]["after_s"]:
            change = health.pop(0)
            emit(event="health", pipeline_id=spec["pipeline_id"], ok=change["ok"],
                 broken_stage=change.get("broken_stage"), reason="scripted")
        if "crash_after_s" in script and time.monotonic() - started >= script["crash_after_s"]:
            if "error" in script:
                emit(event="error", message=script["error"])
            print("stand-in: crashing as scripted", file=sys.stderr, flush=True)
            return int(script.get("exit_code", 3))
        steps += int(script.get("steps_per_s", 10) * interval)
        emit(event="stats", step_ms=script.get("step_ms", 50.0), compute_ms=1.0, transfer_ms=0.0,
             tokens_per_s=0.0, batch_size=1, queue_depth=0, kv_tokens_used=0, kv_tokens_free=0,
             bytes_sent=steps * 1000, bytes_received=steps * 500, bubble_fraction=0.5, steps=steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
