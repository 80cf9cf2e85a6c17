"""How long a stage process takes from its start to ``ready``, and the CPU that costs the host: started
the ordinary way (``python -m worker_runtime.serve --spec``) against forked by the agent's fork server
(agents/fork_server.py), in one run.

    .venv/bin/python benchmarks/stage_start_bench.py [--starts 4] [--layers 4] [--kv-tokens 65536]

Each start loads the same stage of a generated demo checkpoint (the first ``--layers`` of twice as
many, stage 0 of 2) with a KV pool of ``--kv-tokens`` tokens, waits for its ``ready`` line, stops it
(SIGTERM) and reaps it; the two ways alternate, so a noisy machine weighs on both alike. Printed: the
median wall time to ready and the median CPU seconds each start took (the child's user + system, read
when it is reaped), each way, and fork over spawn. The fork server's own warm-up (once per agent) is
printed apart. Not in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.fork_server import FOLDER, ForkServer  # noqa: E402
from agents.stage_process import DEFAULT_COMMAND, FORK_SERVER_COMMAND, start_process  # noqa: E402
from benchmarks.gpu_check_serve import free_port  # noqa: E402
from contracts.names import FORK_SERVER_WARM_FILE  # noqa: E402


def spec_write(folder: Path, model: Path, layers: int, kv_tokens: int) -> Path:
    address = f"tcp://127.0.0.1:{free_port()}"
    spec = {"pipeline_id": "d1-r0", "auth_token": "bench", "model_path": str(model), "stage_index": 0,
            "num_stages": 2, "layers": [0, layers], "bits": 16, "dtype": None, "device": "cpu", "threads": 1,
            "kv_tokens": kv_tokens, "listen": address, "next": f"tcp://127.0.0.1:{free_port()}",
            "head": address, "peer_timeout_s": 2.0, "emulation": None}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one_start(process_of, spec: Path) -> tuple[float, float]:
    """(seconds to ready, CPU seconds of the process) for the process ``process_of(spec)`` starts."""
    cpu_before, started = children_cpu_s(), time.monotonic()
    process = process_of(spec)
    for line in process.stdout:
        if json.loads(line).get("event") == "ready":
            break
    else:
        raise RuntimeError(f"the stage exited before ready: see {spec.parent / 'stderr.log'}")
    ready_s = time.monotonic() - started
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=30)
    process.stdout.close()
    if process.stdin is not None:
        process.stdin.close()
    return ready_s, children_cpu_s() - cpu_before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--kv-tokens", type=int, default=65536)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="motley-start-bench-"))
    model = work / "model"
    subprocess.run([sys.executable, "-m", "worker_runtime.make_demo_model", str(model),
                    "--layers", str(2 * args.layers)], check=True, stdout=subprocess.DEVNULL)
    stages = work / "stages"
    stages.mkdir()
    forks = ForkServer(stages, FORK_SERVER_COMMAND)
    started = time.monotonic()
    forks.replenish(time.monotonic(), capped=False)
    while not (stages / FOLDER / FORK_SERVER_WARM_FILE).exists():
        time.sleep(0.05)
    print(f"fork server warm after {time.monotonic() - started:.2f} s (once per agent)")

    def spawned(spec: Path) -> subprocess.Popen:
        return start_process([*DEFAULT_COMMAND, "--spec", str(spec)], spec.parent, subprocess.DEVNULL)

    def forked(spec: Path):
        process = forks.take(spec)
        if process is None:
            raise RuntimeError("the fork server did not fork")
        return process

    results: dict[str, list[tuple[float, float]]] = {"spawn": [], "fork": []}
    try:
        for n in range(args.starts):
            for way, process_of in (("spawn", spawned), ("fork", forked)):
                spec = spec_write(stages / f"{way}-{n}", model, args.layers, args.kv_tokens)
                results[way].append(one_start(process_of, spec))
    finally:
        forks.close()
    print(f"\n{args.starts} starts each, stage of {args.layers} layers, KV pool {args.kv_tokens} tokens")
    print("| way | to ready (median) | CPU per start (median) |")
    print("| --- | ---: | ---: |")
    medians = {}
    for way, runs in results.items():
        medians[way] = (statistics.median(r for r, _ in runs), statistics.median(c for _, c in runs))
        print(f"| {way} | {medians[way][0]:.3f} s | {medians[way][1]:.3f} s |")
    print(f"| fork / spawn | {medians['fork'][0] / medians['spawn'][0]:.2f}x "
          f"| {medians['fork'][1] / medians['spawn'][1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
