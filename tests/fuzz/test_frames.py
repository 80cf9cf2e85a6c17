"""Hostile input on the data plane: malformed, unauthenticated and replayed frames sent to a real head
(stage 0) and a real relay (stage 1) of a two-stage pipeline.

Each stage must stay up, drop what it cannot trust (counted in ``frames_rejected``), answer a client
where the protocol answers (an authenticated ``submit`` it cannot parse gets an ``error`` frame naming
the problem; an unauthenticated frame gets nothing: no oracle for a peer without the token), leak no
KV space and no memory over 1000 bad frames, and serve a good request afterwards. contracts.md §2.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

import psutil
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contracts.sampling import SamplingParams
from controlplane.gateway.serving.pipeline_client import PipelineClient
from tests.pipeline.conftest import launcher, make_tiny_llama
from tests.pipeline.harness import TOKEN, wait_healthy
from worker_runtime.frames import FrameCodec, FrameError

pytestmark = pytest.mark.timeout(300)
PROMPT = [5, 17, 42, 7]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    model = make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    with launcher(model, tmp_path_factory.mktemp("fuzz-frames")) as start:
        yield start(2, kv_tokens=512)


@pytest.fixture(scope="module")
def sockets(pipeline):
    """A raw DEALER to each stage's ``listen`` address, as an attacker (or a broken peer) has."""
    context = zmq.Context()
    out = {}
    for name, spec in (("head", pipeline.specs[0]), ("relay", pipeline.specs[1])):
        sock = context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(spec.listen)
        out[name] = sock
    time.sleep(0.2)
    yield out
    context.destroy(linger=0)


def signed(header: dict, *tensor_parts: bytes, token: str = TOKEN) -> list[bytes]:
    body = json.dumps(header).encode()
    return [hmac.new(token.encode(), body, hashlib.sha256).digest(), body, *tensor_parts]


def head_header(kind: str, **fields) -> dict:
    return {"type": kind, "pipeline_id": "p0", "tensors": [], **fields}


def f32(*shape: int) -> dict:
    return {"dtype": "float32", "shape": list(shape)}


# Every kind of bad frame the brief names, each to both stages.
MALFORMED = {
    "no parts": [b""],
    "one part": [b"only a mac"],
    "bad JSON header": signed({}) [:1] + [b"{not json"],
    "header not an object": [hmac.new(TOKEN.encode(), b"[1]", hashlib.sha256).digest(), b"[1]"],
    "unknown type": signed(head_header("teleport", epoch=1 << 62)),
    "tensor larger than its part": signed(head_header("batch", tensors=[f32(64, 64)]), b"\0" * 16),
    "wrong dtype string": signed(head_header("batch", tensors=[{"dtype": "float128", "shape": [1]}]),
                                 b"\0" * 16),
    "shape and bytes differ": signed(head_header("batch", tensors=[f32(3, 5)]), b"\0" * 64),
    "huge declared length": signed(head_header("batch", tensors=[f32(1 << 62, 1 << 62)]), b"\0" * 4),
    "size torch cannot take": signed(head_header("batch", tensors=[f32(0, 10**20)]), b""),
    "fractional size": signed(head_header("batch", tensors=[{"dtype": "float32", "shape": [1.5]}]),
                              b"\0" * 4),
    "more parts than tensors": signed(head_header("batch"), b"\0" * 4),
    "wrong pipeline id": signed({**head_header("submit"), "pipeline_id": "p1", "prompt": PROMPT,
                                 "max_tokens": 2}),
    "wrong auth token": signed(head_header("submit", prompt=PROMPT, max_tokens=2), token="guessed"),
    "missing auth": [b"", json.dumps(head_header("submit", prompt=PROMPT, max_tokens=2)).encode()],
    "tampered header": [signed(head_header("submit", prompt=PROMPT, max_tokens=2))[0],
                        json.dumps(head_header("submit", prompt=PROMPT, max_tokens=200)).encode()],
    "replayed batch of an old epoch": signed(head_header("batch", epoch=1, mb=0, seq_ids=[0], starts=[0],
                                                         lengths=[1], sampling=[{}], tensors=[f32(1, 64)]),
                                             b"\0" * 256),
    "batch with no epoch": signed(head_header("batch", mb=0, seq_ids=[0], starts=[0], lengths=[1],
                                              sampling=[{}])),
    "huge header": [b"x" * 32, b"{" * (9 << 20)],
}

# Authenticated submits the head must answer with an error frame, not drop in silence.
BAD_SUBMITS = {
    "no prompt": {"max_tokens": 2},
    "prompt of strings": {"prompt": ["a", "b"], "max_tokens": 2},
    "token outside the vocabulary": {"prompt": [10**9], "max_tokens": 2},
    "negative max_tokens": {"prompt": PROMPT, "max_tokens": -3},
    "sampling not an object": {"prompt": PROMPT, "max_tokens": 2, "sampling": [1, 2]},
    "unknown sampling field": {"prompt": PROMPT, "max_tokens": 2, "sampling": {"temperature": 1, "beam": 4}},
    "negative temperature": {"prompt": PROMPT, "max_tokens": 2, "sampling": {"temperature": -1}},
    "deadline not a number": {"prompt": PROMPT, "max_tokens": 2, "deadline_s": "soon"},
    "longer than every cache": {"prompt": PROMPT, "max_tokens": 10**6},
}


def stage_stats(pipeline) -> dict:
    async def ask():
        async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
            await wait_healthy(client)
            return await client.stats()

    return asyncio.run(ask())


def generate_ok(pipeline) -> list[int]:
    async def run():
        async with PipelineClient(pipeline.head, TOKEN, "p0") as client:
            assert (await wait_healthy(client))["ok"]
            return [e.token_id async for e in client.submit(PROMPT, SamplingParams(), max_tokens=4)]

    return asyncio.run(run())


def rss(pipeline) -> list[int]:
    return [psutil.Process(pid).memory_info().rss for pid in pipeline.pids()]


def assert_up_and_clean(pipeline, free_before: list[int]) -> None:
    assert all(stage.popen.poll() is None for stage in pipeline.stages), [s.stderr() for s in pipeline.stages]
    assert len(generate_ok(pipeline)) == 4
    deadline = time.monotonic() + 10
    while ((free := stage_stats(pipeline)["kv_tokens_free_by_stage"]) != free_before
           and time.monotonic() < deadline):
        time.sleep(0.1)
    assert free == free_before, "KV space leaked"


def test_every_kind_of_malformed_frame_is_dropped_and_counted_by_both_stages(pipeline, sockets):
    reference = generate_ok(pipeline)
    before = stage_stats(pipeline)
    for parts in MALFORMED.values():
        sockets["head"].send_multipart(parts)
        sockets["relay"].send_multipart(parts)
    assert_up_and_clean(pipeline, before["kv_tokens_free_by_stage"])
    dropped_by_codec = len(MALFORMED) - 3  # the unknown type and the two epoch frames pass the codec
    deadline = time.monotonic() + 5  # stage 1's figures come with its next heartbeat
    while True:
        after = stage_stats(pipeline)
        grew = [after["stages"][i]["frames_rejected"] - before["stages"][i]["frames_rejected"]
                for i in (0, 1)]
        if min(grew) >= dropped_by_codec or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert min(grew) >= dropped_by_codec, grew
    assert generate_ok(pipeline) == reference  # nothing of the bad frames changed what the pipeline computes


@pytest.mark.parametrize("name", BAD_SUBMITS)
def test_an_authenticated_submit_it_cannot_take_is_answered_with_a_clear_error(pipeline, sockets, name):
    stage_stats(pipeline)  # waits until the pipeline is whole again after whatever ran before (any order)
    sock = sockets["head"]
    request_id = f"bad-{name}"
    sock.send_multipart(signed(head_header("submit", request_id=request_id, **BAD_SUBMITS[name])))
    assert sock.poll(5000), "no answer"
    answer = json.loads(sock.recv_multipart()[1])
    assert answer["type"] == "error" and answer["request_id"] == request_id and answer["kind"] == "rejected"
    assert answer["message"]


headers = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["submit", "cancel", "stats", "health", "tokens", "failed", "batch",
                                 "x", ""]),
        "pipeline_id": st.sampled_from(["p0", "p0", "p1", ""]),
    },
    optional={
        "tensors": st.lists(
            st.fixed_dictionaries({"dtype": st.sampled_from(["float32", "int64", "bfloat16", "object", ""]),
                                   "shape": st.lists(st.integers(-2, 1 << 70), max_size=4)}),
            max_size=2,
        ),
        "epoch": st.integers(-1, 100),
        "prompt": st.lists(st.integers(-5, 300), max_size=6),
        "max_tokens": st.integers(-2, 4),
        "request_id": st.text(max_size=8),
        "sampling": st.dictionaries(st.sampled_from(["temperature", "top_k", "top_p", "seed", "bogus"]),
                                    st.one_of(st.integers(-2, 5), st.floats(-1, 2), st.none()), max_size=3),
        "seq_ids": st.lists(st.integers(-1, 10), max_size=3),
        "mb": st.integers(-1, 10),
    },
)
frames = st.one_of(
    st.lists(st.binary(max_size=64), min_size=1, max_size=5),  # garbage
    st.tuples(headers, st.lists(st.binary(max_size=256), max_size=3)).map(lambda h: signed(h[0], *h[1])),
)


def test_generated_frames_leave_both_stages_up_without_leaks(pipeline, sockets):
    """Hypothesis' frames (bounded), then rounds of bad frames: KV space back, a good request served,
    RSS flat.

    Flat is measured apart for the small frames and the 9 MiB header: a stage's allocator keeps up to
    a couple of the 9 MiB buffers it last freed (RSS moved by 0, 9 or 18 MiB from one round to the
    next, up and down, over five rounds: not a trend), which hid everything else when both were
    mixed. Each phase sends each stage twelve thousand small frames; fifty huge headers a round show
    one leaked buffer in fifty."""
    free_before = stage_stats(pipeline)["kv_tokens_free_by_stage"]

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(frames, st.sampled_from(["head", "relay"]))
    def send(parts, target):
        sockets[target].send_multipart(parts)

    send()
    assert_up_and_clean(pipeline, free_before)
    huge = MALFORMED["huge header"]
    small = [parts for name, parts in MALFORMED.items() if name != "huge header"]

    def rounds(frames: list[list[bytes]], per_round: int) -> list[list[int]]:
        seen = []
        for _ in range(3):
            for i in range(per_round):
                sockets["head" if i % 2 else "relay"].send_multipart(frames[i % len(frames)])
            stage_stats(pipeline)  # both stages have taken them by the time the head answers
            time.sleep(0.5)
            seen.append(rss(pipeline))
        return seen

    # The first phase grows the allocator's arenas. A leak grows the peak of every later phase; the
    # arenas may still step up once (1.1 MiB, in one phase of one run in five), so a stage fails only
    # when both later phases grew by a MiB.
    # Both stages' peaks come from the same rounds; a stage takes half of a round's frames.
    phases = [rounds(small, 8000) for _ in range(3)]
    peaks = [[max(r[i] for r in phase) for i in (0, 1)] for phase in phases]
    grown = [[later[i] - earlier[i] for i in (0, 1)] for earlier, later in zip(peaks, peaks[1:])]
    assert all(min(g[i] for g in grown) < 1 << 20 for i in (0, 1)), (
        f"RSS grew by {grown} bytes (per stage) in each of two phases of 24000 small bad frames")
    first, *later = rounds([huge], 50)
    kept = 2 * len(huge[1])  # the allocator may keep two freed buffers of the largest frame
    grown = [max(r[i] for r in later) - first[i] for i in (0, 1)]
    assert all(g <= kept + (2 << 20) for g in grown), f"RSS grew by {grown} bytes over 100 huge headers"
    assert_up_and_clean(pipeline, free_before)


@pytest.mark.parametrize("shape", [[0, 10**20], [1.5], "12", [True], [1] * 9, None])
def test_a_tensor_size_torch_cannot_take_is_a_frame_error_not_a_crash(shape):
    """``[0, 10**20]`` reached ``torch.empty`` and raised a TypeError out of ``receive``: the stage died."""
    codec = FrameCodec("p0", TOKEN)
    with pytest.raises(FrameError, match="bad tensor description"):
        codec.decode(signed(head_header("batch", tensors=[{"dtype": "float32", "shape": shape}]), b""))
