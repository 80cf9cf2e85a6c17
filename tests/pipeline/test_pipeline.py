"""Stage processes on loopback: same tokens as one process, admission, cancellation, bad frames, SIGTERM."""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import torch
import zmq

from contracts.pipeline_errors import DeadlineExceeded, PipelineBroken, RequestRejected
from contracts.precision import Precision
from contracts.sampling import SamplingParams
from controlplane.gateway.serving.pipeline_client import PipelineClient
from worker_runtime.chain import generate
from worker_runtime.frames import FrameCodec
from worker_runtime.stage import Stage

from .harness import TOKEN, wait_healthy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # real stage processes


def reference(model, prompt: list[int], max_tokens: int,
              params: SamplingParams = SamplingParams()) -> list[int]:
    torch.set_num_threads(1)
    stage = Stage.load(model, 0, 6, kv_tokens=1024)
    return generate([stage], [prompt], params, max_new_tokens=max_tokens)[0]


async def collect(client: PipelineClient, prompt, max_tokens, params=SamplingParams(), **kw) -> list[int]:
    return [e.token_id async for e in client.submit(prompt, params, max_tokens=max_tokens, **kw)]


async def test_three_processes_generate_the_tokens_of_one_process(shared_pipeline, tiny_model):
    """32 concurrent requests, mixed lengths, and a KV budget that forces queueing (512 < 32 x 48); then
    one alone whose output repeats its prompt, which speculation verifies several tokens at a time."""
    pipeline = shared_pipeline
    rng = random.Random(0)
    jobs = [([rng.randrange(1, 256) for _ in range(rng.randrange(1, 21))], rng.randrange(1, 25))
            for _ in range(32)]
    seeded = SamplingParams(temperature=0.9, top_k=40, seed=7)
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        before = (await client.stats())["completed"]  # the module's other tests share the pipeline
        outputs = await asyncio.gather(*(collect(client, p, n) for p, n in jobs),
                                       collect(client, jobs[0][0], 12, seeded))
        repeating = [5, 6, 7] * 8
        outputs.append(await collect(client, repeating, 40))
        stats = await client.stats()
    stage = Stage.load(tiny_model, 0, 6, kv_tokens=1024)
    expected = [generate([stage], [p], max_new_tokens=n)[0] for p, n in jobs]
    expected.append(generate([stage], [jobs[0][0]], seeded, max_new_tokens=12)[0])
    expected.append(generate([stage], [repeating], max_new_tokens=40)[0])
    assert outputs == expected
    assert stats["stages"][0]["spec_accepted_tokens"] > 0
    assert stats["completed"] - before == 34 and stats["queue_depth"] == 0 and len(stats["stages"]) == 3
    assert (stats["stages"][0]["steps"] > 0
            and stats["kv_tokens_free_by_stage"] == {"0": 512, "1": 512, "2": 512})
    for stage_process in pipeline.stages:
        event = stage_process.wait_event("stats", timeout_s=5)
        assert {"step_ms", "compute_ms", "transfer_ms", "bubble_fraction", "kv_tokens_free"} <= set(event)


async def test_a_stage_mixing_two_precisions_serves_what_it_computes_in_process(start_pipeline, tiny_model):
    """The spec's low_bits / low_from reach the stage process: layers [4, 6) and the head at int4."""
    pipeline = start_pipeline(2, per_stage={1: {"low_bits": 4, "low_from": 4}})
    prompt = [5, 6, 7, 8]
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        tokens = await collect(client, prompt, 12)
    torch.set_num_threads(1)
    stages = [Stage.load(tiny_model, 0, 3, kv_tokens=1024),
              Stage.load(tiny_model, 3, 6, precision=Precision(16, 4, 4), kv_tokens=1024)]
    assert tokens == generate(stages, [prompt], max_new_tokens=12)[0]
    assert tokens != reference(tiny_model, prompt, 12)  # int4 moves tokens of this model


# ~20 ms a step on the tiny model
SLOW = {"memory_bandwidth_gbs": 1.0, "fp16_tflops": 1.0, "time_scale": 50.0}


async def test_kv_budget_queues_refuses_cancel_frees_and_sigterm_drains(start_pipeline):
    pipeline = start_pipeline(2, kv_tokens=128, max_queue=1, emulation=SLOW)
    async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
        assert (await wait_healthy(client))["ok"]
        with pytest.raises(RequestRejected, match="smallest stage holds 128"):
            await collect(client, [1] * 100, 100)
        first = asyncio.create_task(collect(client, [1, 2, 3], 90, request_id="first"))
        await asyncio.sleep(0.3)
        second = asyncio.create_task(collect(client, [4, 5, 6], 90, request_id="second"))
        await asyncio.sleep(0.3)
        stats = await client.stats()
        assert stats["queue_depth"] == 1 and stats["running"] == 1
        with pytest.raises(RequestRejected, match="queue full"):
            await collect(client, [7], 90)
        assert await client.cancel("first")
        partial = await first  # a cancelled stream just ends
        assert 0 < len(partial) < 90
        await asyncio.sleep(0.3)
        stats = await client.stats()
        assert stats["queue_depth"] == 0 and stats["running"] == 1  # the queued one got the freed space
        assert await client.cancel("second") and not await client.cancel("second")
        await second
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded, match="deadline"):
            await collect(client, [1, 2], 90, deadline_s=0.3)
        assert time.monotonic() - started < 1.5
        await asyncio.sleep(0.5)
        stats = await client.stats()
        assert stats["kv_tokens_free_by_stage"] == {"0": 128, "1": 128}
        assert stats["stages"][0]["kv_tokens_free"] == 128 and stats["stages"][0]["compute_ms"] >= 10  # paced

        # Two requests that each fill every stage's whole cache run one after the other: the second's
        # prefill reaches stage 1 only after the first's space is freed there.
        both = await asyncio.gather(collect(client, [1] * 100, 28), collect(client, [2] * 100, 28))
        assert [len(tokens) for tokens in both] == [28, 28]

        # SIGTERM drains: the running request still finishes, a new one is refused, the head exits 0.
        running = asyncio.create_task(collect(client, [8, 9], 20))
        await asyncio.sleep(0.2)
        pipeline.stages[0].popen.terminate()
        await asyncio.sleep(0.1)
        with pytest.raises(PipelineBroken, match="draining"):
            await collect(client, [1], 2)
        assert len(await running) == 20
        assert await asyncio.to_thread(pipeline.stages[0].popen.wait, 10) == 0
        pipeline.stages[1].popen.terminate()
        assert await asyncio.to_thread(pipeline.stages[1].popen.wait, 10) == 0


async def test_bad_frames_are_rejected_logged_and_the_stage_keeps_serving(shared_pipeline, tiny_model):
    pipeline = shared_pipeline
    context = zmq.Context()
    sockets = []
    try:
        for spec in pipeline.specs[:2]:
            sock = context.socket(zmq.DEALER)
            sockets.append(sock)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(spec.listen)
            good, bad = FrameCodec("p0", TOKEN), FrameCodec("p0", "wrong-token")
            sock.send_multipart(bad.encode({"type": "reset", "epoch": 2**62}))
            body = b'{"type": "batch", "pipeline_id": "p0", "tensors": [}'
            sock.send_multipart([good._mac(body), body])
            sock.send_multipart(good.encode({"type": "batch", "epoch": 0, "mb": 1, "seq_ids": "x"}))
            sock.send_multipart([b"lonely"])
        async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
            assert (await wait_healthy(client))["ok"]
            assert await collect(client, [5, 6, 7], 6) == reference(tiny_model, [5, 6, 7], 6)
            assert (await client.stats())["stages"][0]["frames_rejected"] >= 3
        for stage in pipeline.stages[:2]:
            log = stage.stderr()
            assert "bad authentication" in log and "not JSON" in log and "at least 2 parts" in log
    finally:
        context.destroy(linger=0)


def test_a_clients_tokens_of_one_micro_batch_arrive_in_one_frame(shared_pipeline, tiny_model):
    """Six requests of one client on 3 micro-batches: some step carries several of them, in one frame.
    The shared pipeline is waited for first: run before the module's other tests (random order), the
    submits reached a head whose pipeline was not whole yet and were refused."""

    async def healthy() -> dict:
        async with PipelineClient(shared_pipeline.head, TOKEN, "p0") as client:
            return await wait_healthy(client)

    assert asyncio.run(healthy())["ok"]
    codec, context = FrameCodec("p0", TOKEN), zmq.Context()
    try:
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(shared_pipeline.head)
        prompts = {f"r{i}": [3 + i, 9, 27] for i in range(6)}
        for request_id, prompt in prompts.items():
            sock.send_multipart(codec.encode({"type": "submit", "request_id": request_id, "prompt": prompt,
                                              "max_tokens": 6}))
        frames, streams = [], {request_id: [] for request_id in prompts}
        while sum(len(tokens) for tokens in streams.values()) < 6 * 6:
            header = codec.decode(sock.recv_multipart()).header
            if header["type"] == "tokens":
                frames.append(header)
                for request_id, token_id, _ in header["items"]:
                    streams[request_id].append(token_id)
        assert streams == {request_id: reference(tiny_model, prompt, 6)
                           for request_id, prompt in prompts.items()}
        assert len(frames) < 6 * 6 and max(len(f["items"]) for f in frames) >= 2
        assert [f["items"][-1][2] for f in frames][-1] == "length"
    finally:
        context.destroy(linger=0)


def test_a_bad_spec_prints_an_error_event_and_exits_nonzero(tmp_path):
    import json
    import subprocess
    import sys

    from tests.support.processes import REPO_ROOT

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"pipeline_id": "p0", "bits": 3}))
    done = subprocess.run(
        [sys.executable, "-m", "worker_runtime.serve", "--spec", str(spec)], capture_output=True, text=True,
        cwd=REPO_ROOT, timeout=60
    )
    assert done.returncode == 1
    event = json.loads(done.stdout.strip().splitlines()[-1])
    assert event["event"] == "error" and "spec" in event["message"]
