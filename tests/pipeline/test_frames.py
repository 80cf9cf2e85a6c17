"""The wire format: round trips without copies or pickles, and every kind of bad frame refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from worker_runtime.frames import FrameCodec, FrameError

codec = FrameCodec("p0", "secret")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_round_trip_keeps_values_dtype_and_shape(dtype):
    tensor = (torch.randn(5, 7) * 100).to(dtype)
    frame = codec.decode(codec.encode({"type": "batch", "x": [1, 2]}, [tensor]))
    assert frame.type == "batch" and frame.header["x"] == [1, 2]
    assert frame.tensors[0].dtype == dtype and torch.equal(frame.tensors[0], tensor)


def test_wrong_token_is_refused():
    parts = FrameCodec("p0", "other").encode({"type": "batch"})
    with pytest.raises(FrameError, match="authentication"):
        codec.decode(parts)


def test_tampered_header_is_refused():
    mac, body = codec.encode({"type": "batch", "epoch": 1})
    with pytest.raises(FrameError, match="authentication"):
        codec.decode([mac, body.replace(b'"epoch": 1', b'"epoch": 2')])


def test_another_pipeline_is_refused():
    with pytest.raises(FrameError, match="pipeline"):
        codec.decode(FrameCodec("p1", "secret").encode({"type": "batch"}))


def _signed(body: bytes) -> list[bytes]:
    return [codec._mac(body), body]


@pytest.mark.parametrize(
    "body, parts, match",
    [
        (b"not json", [], "not JSON"),
        (b"[1, 2]", [], "JSON object"),
        (json.dumps({"type": "batch", "pipeline_id": "p0", "tensors": []}).encode(), [b"x"], "describe"),
        (
            json.dumps({"type": "b", "pipeline_id": "p0",
                        "tensors": [{"dtype": "float32", "shape": [3]}]}).encode(),
            [b"abcd"],
            "does not match",
        ),
        (
            json.dumps({"type": "b", "pipeline_id": "p0",
                        "tensors": [{"dtype": "object", "shape": [1]}]}).encode(),
            [b"abcd"],
            "bad tensor",
        ),
    ],
)
def test_malformed_frames_are_refused(body, parts, match):
    with pytest.raises(FrameError, match=match):
        codec.decode(_signed(body) + parts)


def test_too_few_parts():
    with pytest.raises(FrameError, match="at least 2 parts"):
        codec.decode([b"x"])


@pytest.mark.parametrize("scored", [[[1, 2]], [[1], [2]], [[-1]], [["x"]], 5])
def test_a_batch_whose_scored_prompts_do_not_fit_its_rows_is_refused(scored):
    """``scored`` must name fewer tokens than the sequence's logit rows: its last row is sampled."""
    from contracts.sampling import SamplingParams
    from worker_runtime.frames import Frame
    from worker_runtime.protocol import batch_from_frame, batch_message
    from worker_runtime.stage import Batch

    batch = Batch.of_tokens([1], [[5, 6, 7]], [0], logit_rows=[2], scored=[[7]])
    header, tensors = batch_message(1, 1, batch, [SamplingParams(prompt_logprobs=0)], batch.input_ids)
    parsed, _ = batch_from_frame(Frame(header, tensors), first_stage=True)
    assert parsed.scored == [[7]] and parsed.sampled_rows() == [1] and parsed.produced_positions() == [3]
    with pytest.raises(FrameError):
        batch_from_frame(Frame({**header, "scored": scored}, tensors), first_stage=True)


@pytest.mark.parametrize("traces", [{"2": "00-x"}, {"one": "00-x"}, ["00-x"]])
def test_a_batch_whose_traces_name_other_sequences_is_refused(traces):
    """``traces`` (the head's span of each traced sequence) names only the batch's own sequences."""
    from contracts.sampling import SamplingParams
    from worker_runtime.frames import Frame
    from worker_runtime.protocol import batch_from_frame, batch_message
    from worker_runtime.stage import Batch

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    batch = replace(Batch.of_tokens([1], [[5, 6, 7]], [0]), traces={1: parent})
    header, tensors = batch_message(1, 1, batch, [SamplingParams()], batch.input_ids)
    assert header["traces"] == {"1": parent}
    parsed, _ = batch_from_frame(Frame(header, tensors), first_stage=True)
    assert parsed.traces == {1: parent}
    with pytest.raises(FrameError):
        batch_from_frame(Frame({**header, "traces": traces}, tensors), first_stage=True)
