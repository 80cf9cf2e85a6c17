"""The stage spec refuses what the process could not run; statistics average over their window."""

from __future__ import annotations

import time

import pytest

from contracts.stage_spec import SpecError, StageSpec
from worker_runtime.stats import StageStats

BASE = {
    "pipeline_id": "p0",
    "auth_token": "t",
    "model_path": "/m",
    "stage_index": 0,
    "num_stages": 2,
    "layers": [0, 3],
    "listen": "tcp://127.0.0.1:1",
    "next": "tcp://127.0.0.1:2",
    "head": "tcp://127.0.0.1:1",
}
DRAFT = {"address": "tcp://127.0.0.1:3", "pipeline_id": "d0", "auth_token": "dt"}


def test_a_valid_spec_round_trips():
    spec = StageSpec.from_dict({**BASE,
                                "emulation": {"memory_bandwidth_gbs": 300, "fp16_tflops": 65,
                                              "time_scale": 20}})
    assert spec.is_head and not spec.is_last and spec.emulation.time_scale == 20
    assert StageSpec.from_dict(spec.to_json()) == spec
    mixed = StageSpec.from_dict({**BASE, "low_bits": 4, "low_from": 2})
    assert (mixed.bits, mixed.low_bits, mixed.low_from) == (16, 4, 2)
    drafted = StageSpec.from_dict({**BASE, "speculation": "draft", "draft": DRAFT})
    assert drafted.draft.pipeline_id == "d0" and StageSpec.from_dict(drafted.to_json()) == drafted


@pytest.mark.parametrize(
    "change, match",
    [
        ({"bits": 3}, "bits"),
        ({"low_bits": 4}, "both are needed"),
        ({"low_bits": 4, "low_from": 3}, "strictly inside"),
        ({"next": None}, "next must be null"),
        ({"stage_index": 2}, "stage_index"),
        ({"layers": [3, 3]}, "layers"),
        ({"auth_token": ""}, "auth_token"),
        ({"surprise": 1}, "unknown spec fields"),
        ({"emulation": {"bandwidth": 1}}, "invalid stage spec"),
        ({"speculation": "draft"}, "needs draft"),
        ({"speculation": "draft", "draft": {**DRAFT, "address": ""}}, "draft needs a non-empty address"),
    ],
)
def test_bad_specs_name_the_field(change, match):
    with pytest.raises(SpecError, match=match):
        StageSpec.from_dict({**BASE, **change})


def test_stats_average_steps_and_count_bubbles():
    stats = StageStats(window_s=10.0)
    stats.started -= 1.0  # one second into the run
    stats.record_step(0.004, 0.001, batch_size=8, tokens=8)
    stats.record_step(0.002, 0.001, batch_size=4, tokens=4)
    stats.record_idle(0.25)
    snap = stats.snapshot(kv_used=32, kv_free=96, bytes_sent=10, bytes_received=20)
    assert snap["compute_ms"] == 3.0 and snap["transfer_ms"] == 1.0 and snap["step_ms"] == 4.0
    assert snap["batch_size"] == 6 and snap["steps"] == 2 and snap["kv_tokens_free"] == 96
    assert 0.2 < snap["bubble_fraction"] <= 0.25 and 10 < snap["tokens_per_s"] <= 12
    stats.window_s = 0.01
    time.sleep(0.02)
    assert stats.snapshot(kv_used=0, kv_free=0, bytes_sent=0, bytes_received=0)["step_ms"] == 0


def test_decode_figures_cover_only_decode_steps():
    """A step where a sequence brings a prompt chunk is not a decode step: the decode figures (what
    calibration compares with the planner's decode prediction) leave it out."""
    stats = StageStats(window_s=10.0)
    stats.record_step(0.050, 0.001, batch_size=2, tokens=130, kv_tokens=130)  # prefill (+ one decoding)
    stats.record_step(0.004, 0.001, batch_size=4, tokens=4, kv_tokens=400)
    stats.record_step(0.006, 0.001, batch_size=2, tokens=2, kv_tokens=300)
    snap = stats.snapshot(kv_used=0, kv_free=0, bytes_sent=0, bytes_received=0)
    assert snap["decode_steps"] == 2 and snap["decode_ms"] == 5.0
    assert snap["decode_batch"] == 3.0 and snap["decode_kv_tokens"] == 350.0
    assert snap["compute_ms"] == 20.0  # every step
    empty = StageStats().snapshot(kv_used=0, kv_free=0, bytes_sent=0, bytes_received=0)
    assert (empty["decode_steps"], empty["decode_ms"], empty["decode_batch"]) == (0, 0.0, 0.0)
