"""Pipeline data-plane benchmark: throughput against one process, hop latency, transfer rate.

    python benchmarks/pipeline_bench.py [--layers 8 --hidden 768 --seqs 8 16 32 --steps 48]

Side by side in one run, on the demo model (``worker_runtime.make_demo_model``):
1. aggregate decode tokens/s of a 2-stage pipeline (2 processes, 1 torch thread each, on loopback)
   against one process decoding the same batch with 2 threads (goal: at least 0.85x), and, because
   two threads can lose to one on a loaded machine, against the better of 1 and 2 threads too; and
   against the pipeline's own bound (twice what one thread decodes with half the sequences: each
   stage busy all the time with its half of the layers for micro-batches of half the batch);
2. added latency of one stage hop for a decode step: a 1-token activation frame echoed between two
   processes through the real codec and transport (goal: under 0.3 ms), and the same seen end to end
   (per-token interval of one sequence through the pipeline minus one process's step time, per hop);
3. prefill activation transfer rate (a [tokens, hidden] frame) against a raw TCP socket copy of the
   same bytes between the same two processes.
Prints a Markdown table for docs/benchmarks.md.

    python benchmarks/pipeline_bench.py --netns [--layers 6 --hidden 64 --prefill-tokens 2048]

runs instead 3 stages in 3 network namespaces over links shaped to fleet ``network_gbps`` (root;
benchmarks/netns_pipeline.py): each hop and the pipeline's prefill against the planner's prediction.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import zmq  # noqa: E402

from controlplane.gateway.serving.pipeline_client import PipelineClient  # noqa: E402
from tests.pipeline.harness import TOKEN, Pipeline, pipeline_specs, wait_healthy  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from worker_runtime.chain import free_sequences, run_stages  # noqa: E402
from worker_runtime.frames import FrameCodec  # noqa: E402
from worker_runtime.stage import Batch, Stage  # noqa: E402
from worker_runtime.transport import ZmqTransport  # noqa: E402

# ----- 1. throughput


def single_process_decode(stage: Stage, seqs: int, steps: int, prompt_len: int, threads: int) -> float:
    """Decode tokens/s of one process running all layers over one batch of ``seqs`` sequences."""
    torch.set_num_threads(threads)
    ids = list(range(seqs))
    try:
        prompts = [[(i * 7 + j) % 200 + 1 for j in range(prompt_len)] for i in ids]
        tokens = run_stages([stage], Batch.of_tokens(ids, prompts, [0] * seqs)).argmax(-1).tolist()
        started = time.perf_counter()
        for step in range(steps):
            logits = run_stages([stage],
                                Batch.of_tokens(ids, [[t] for t in tokens], [prompt_len + step] * seqs))
            tokens = logits.argmax(-1).tolist()
        return seqs * steps / (time.perf_counter() - started)
    finally:
        free_sequences([stage], ids)


async def pipeline_decode(head: str, seqs: int, steps: int, prompt_len: int) -> tuple[float, float]:
    """Decode tokens/s of ``seqs`` concurrent requests, counted once every request has its first token.

    Also returns the mean interval between tokens of one request, for the end-to-end hop estimate.
    """
    async with PipelineClient(head, TOKEN, "bench", timeout_s=30) as client:
        await wait_healthy(client)
        firsts: list[float] = []
        stamps: list[list[float]] = []

        async def one(i: int) -> None:
            times = []
            async for _ in client.submit([(i * 7 + j) % 200 + 1 for j in range(prompt_len)],
                                         max_tokens=steps + 1):
                times.append(time.perf_counter())
            firsts.append(times[0])
            stamps.append(times)

        await asyncio.gather(*(one(i) for i in range(seqs)))
        start, end = max(firsts), max(t[-1] for t in stamps)
        decoded = sum(sum(1 for x in t if x > start) for t in stamps)
        gaps = [b - a for t in stamps for a, b in zip(t[1:], t[2:])]
        return decoded / (end - start), sum(gaps) / len(gaps)


def start_pipeline(model: Path, layers: int, workdir: Path, kv_tokens: int) -> Pipeline:
    pipeline = Pipeline(
        pipeline_specs(model, layers, 2, pipeline_id="bench", kv_tokens=kv_tokens, peer_timeout_s=30.0),
        workdir
    )
    pipeline.wait_ready(timeout_s=180)
    return pipeline


# ----- 2 and 3. hop latency and transfer rate, against an echo process


def echo(address: str, raw_port: int) -> None:
    """The far side: answer each frame with a tiny frame; answer each raw-socket payload with one byte."""
    transport = ZmqTransport(FrameCodec("bench", TOKEN), address, None, None)
    raw = socket.create_server(("127.0.0.1", raw_port))
    print("ready", flush=True)
    conn, _ = raw.accept()
    conn.setblocking(False)
    buffer = bytearray(1 << 26)
    while True:
        for message in transport.receive(0.001):
            if message.frame.type == "stop":
                return
            transport.reply(message.peer, {"type": "ack"},
                            message.frame.tensors[:1] if message.frame.header.get("echo") else [])
        try:
            while (n := conn.recv_into(buffer)) > 0:
                if buffer[n - 1] == 0xFF:  # the sender ends each payload with 0xFF
                    conn.sendall(b"k")
        except BlockingIOError:
            pass


class EchoPeer:
    def __init__(self) -> None:
        self.address, self.raw_port = f"tcp://127.0.0.1:{free_port()}", free_port()
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--echo", self.address, str(self.raw_port)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert self.process.stdout.readline().strip() == "ready"
        self.codec = FrameCodec("bench", TOKEN)
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(self.address)
        self.raw = socket.create_connection(("127.0.0.1", self.raw_port))
        self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def frame_round_trip(self, tensor: torch.Tensor, echo_back: bool) -> float:
        header = {"type": "batch", "epoch": 1, "mb": 1, "seq_ids": [1], "starts": [9], "lengths": [1],
                  "echo": echo_back}
        started = time.perf_counter()
        self.sock.send_multipart(self.codec.encode(header, [tensor]), copy=False)
        frame = self.codec.decode(self.sock.recv_multipart(copy=False))
        if echo_back:
            frame.tensors[0].clone()  # the receiver materialises the activation, as a stage would
        return time.perf_counter() - started

    def raw_round_trip(self, payload: bytes) -> float:
        started = time.perf_counter()
        self.raw.sendall(payload)
        self.raw.recv(1)
        return time.perf_counter() - started

    def close(self) -> None:
        self.sock.send_multipart(self.codec.encode({"type": "stop"}))
        self.process.wait(timeout=10)
        self.raw.close()
        self.context.destroy(linger=0)


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def hop_and_transfer(hidden: int, prefill_tokens: int, repeats: int = 2000) -> dict[str, float]:
    peer = EchoPeer()
    try:
        one = torch.randn(1, hidden)
        for _ in range(200):
            peer.frame_round_trip(one, True)
        hop_ms = median([peer.frame_round_trip(one, True) for _ in range(repeats)]) / 2 * 1e3
        big = torch.randn(prefill_tokens, hidden)
        payload = big.numpy().tobytes() + b"\xff"
        for _ in range(3):
            peer.frame_round_trip(big, False)
            peer.raw_round_trip(payload)
        frame_s = median([peer.frame_round_trip(big, False) for _ in range(20)])
        raw_s = median([peer.raw_round_trip(payload) for _ in range(20)])
        return {"hop_ms": hop_ms, "frame_gbs": big.nbytes / frame_s / 1e9,
                "raw_gbs": big.nbytes / raw_s / 1e9, "bytes": big.nbytes}
    finally:
        peer.close()


# ----- the run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--seqs", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the best counts")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--prefill-tokens", type=int, default=2048)
    parser.add_argument("--netns", action="store_true", help="stages in network namespaces over shaped links")
    parser.add_argument("--echo", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo:
        echo(args.echo[0], int(args.echo[1]))
        return
    workdir = Path(tempfile.mkdtemp(prefix="pipeline-bench-"))
    model = workdir / "demo"
    subprocess.run(
        [sys.executable, "-m", "worker_runtime.make_demo_model", str(model), "--layers", str(args.layers),
         "--hidden", str(args.hidden), "--intermediate", str(args.intermediate)],
        check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
    )
    if args.netns:
        from benchmarks.netns_pipeline import run

        run(model, args.layers, args.hidden, args.prefill_tokens, args.repeats, workdir)
        return
    print(f"demo model: {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    kv_tokens = max(args.seqs) * (args.prompt + args.steps + 32)
    stage = Stage.load(model, 0, args.layers, kv_tokens=kv_tokens)
    rows = []
    pipeline = start_pipeline(model, args.layers, workdir, kv_tokens)
    try:
        # Alternate the two and keep the best of each: on a shared machine, load only ever slows a run down.
        for seqs in args.seqs:
            single1, single2, half1, piped = 0.0, 0.0, 0.0, 0.0
            for _ in range(args.repeats):
                single2 = max(single2, single_process_decode(stage, seqs, args.steps, args.prompt, threads=2))
                single1 = max(single1, single_process_decode(stage, seqs, args.steps, args.prompt, threads=1))
                half1 = max(half1,
                            single_process_decode(stage, seqs // 2, args.steps, args.prompt, threads=1))
                piped = max(piped,
                            asyncio.run(pipeline_decode(pipeline.head, seqs, args.steps, args.prompt))[0])
            # Two 1-thread stages, each busy all the time with micro-batches of half the sequences, at
            # the speed one thread runs all layers for half the sequences: the pipeline's upper bound.
            rows.append((seqs, single1, single2, 2 * half1, piped))
        one_step = min(1 / single_process_decode(stage, 1, args.steps, args.prompt, threads=1)
                       for _ in range(args.repeats))
        interval = min(asyncio.run(pipeline_decode(pipeline.head, 1, args.steps, args.prompt))[1]
                       for _ in range(args.repeats))
    finally:
        pipeline.stop()
    link = hop_and_transfer(args.hidden, args.prefill_tokens)
    print(f"load average {os.getloadavg()[0]:.1f} at the end; best of {args.repeats} runs each")
    print("\n| concurrent sequences | 1 process, 2 threads (tok/s) | 2-stage pipeline, 1 thread each (tok/s) "
          "| pipeline / 2-thread process | 1 process, 1 thread (tok/s) | pipeline / best single process | "
          "pipeline bound: 2 x 1 thread at half the sequences (tok/s) | pipeline / bound |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seqs, single1, single2, bound, piped in rows:
        print(f"| {seqs} | {single2:.0f} | {piped:.0f} | {piped / single2:.2f}x | {single1:.0f} | "
              f"{piped / max(single1, single2):.2f}x | {bound:.0f} | {piped / bound:.2f}x |")
    print(f"\n- one hop, 1-token activation ({args.hidden} x fp32), codec + zmq, echo between two processes: "
          f"{link['hop_ms']:.3f} ms (median of 2000, half a round trip)")
    print(f"- end to end, one sequence: {interval * 1e3:.2f} ms per token through the pipeline vs "
          f"{one_step * 1e3:.2f} ms per step in one process (1 thread): "
          f"{(interval - one_step) / 2 * 1e3:.2f} ms per hop "
          f"(2 hops: stage 0 -> 1 -> head, scheduling included)")
    print(f"- prefill activation {args.prefill_tokens} x {args.hidden} fp32 ({link['bytes'] / 1e6:.1f} MB): "
          f"{link['frame_gbs']:.2f} GB/s as a frame vs {link['raw_gbs']:.2f} GB/s raw TCP socket copy")


if __name__ == "__main__":
    main()
