"""Emulation pacing: a stage on a slower modeled device takes proportionally longer per step, and one
made to throttle (the agent's factor file) slows down and recovers without a restart."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from contracts.footprint import stage_footprint
from contracts.model_config import ModelConfig
from contracts.precision import Precision
from contracts.profiler import profile_model
from contracts.stage_spec import Emulation
from worker_runtime.pacing import Pacer, read_weight_bytes
from worker_runtime.stage import Batch, Stage


def timed_step(stage: Stage, pacer: Pacer, seq_id: int) -> float:
    batch = Batch.of_tokens([seq_id], [[1, 2, 3, 4]], [0])
    started = time.perf_counter()
    stage.forward(batch)
    pacer.pace(batch, time.perf_counter() - started)
    stage.kv.free(seq_id)
    return time.perf_counter() - started


def test_modeled_time_follows_the_roofline(tiny_model):
    stage = Stage.load(tiny_model, 0, 3, kv_tokens=256)
    fast = Pacer(stage, Emulation(memory_bandwidth_gbs=2.0, fp16_tflops=1.0, time_scale=1.0))
    slow = Pacer(stage, Emulation(memory_bandwidth_gbs=0.5, fp16_tflops=1.0, time_scale=1.0))
    decode = Batch(seq_ids=[1], start_positions=[10], lengths=[1])
    assert slow.modeled_s(decode) == 4 * fast.modeled_s(decode)  # memory-bound: bandwidth ratio
    expected = (read_bytes_planned(tiny_model, 0, 3) + stage.kv.bytes_per_token * 11) / 2e9
    assert abs(fast.modeled_s(decode) - expected) < 1e-12
    compute_bound = Pacer(stage, Emulation(memory_bandwidth_gbs=1e6, fp16_tflops=1e-6, time_scale=1.0))
    long_prefill = Batch(seq_ids=[1], start_positions=[0], lengths=[64])
    # FLOPs grow with tokens
    assert compute_bound.modeled_s(long_prefill) > 60 * compute_bound.modeled_s(decode)


def read_bytes_planned(model, start: int, end: int, bits: int = 16) -> int:
    """What the planner says a step of [start, end) reads: the footprint's weights less the embedding
    table (a lookup), as the card it stands for would hold them."""
    profile = profile_model(ModelConfig.from_file(model), name="tiny")
    embedding = profile.embedding.weight_bytes[16] if start == 0 else 0
    return stage_footprint(profile, start, end, Precision(bits), batch=1).weights_bytes - embedding


def test_a_step_reads_what_the_planner_prices(tiny_model):
    """Float weights at 16 bits whatever the CPU stage computes in, quantized ones as stored, the head
    on the last stage, and not the embedding table, so a calibration learns the device, not the emulator."""
    for start, end, bits in [(0, 3, 16), (0, 6, 16), (1, 6, 8), (0, 2, 4), (3, 6, 4)]:
        stage = Stage.load(tiny_model, start, end, kv_tokens=64, precision=Precision(bits))
        assert read_weight_bytes(stage) == read_bytes_planned(tiny_model, start, end, bits), (
            start, end, bits)


def test_a_slower_device_takes_proportionally_longer(tiny_model):
    torch.set_num_threads(1)
    stage = Stage.load(tiny_model, 0, 3, kv_tokens=256)
    scale = 0.06 / Pacer(stage, Emulation(1.0, 1.0, 1.0)).modeled_s(Batch([1], [0], [4]))  # 60 ms at 1 GB/s
    fast = Pacer(stage, Emulation(memory_bandwidth_gbs=1.0, fp16_tflops=1.0, time_scale=scale))
    slow = Pacer(stage, Emulation(memory_bandwidth_gbs=1 / 3, fp16_tflops=1 / 3, time_scale=scale))
    fast_s = min(timed_step(stage, fast, 1) for _ in range(3))
    slow_s = min(timed_step(stage, slow, 2) for _ in range(3))
    assert 0.059 < fast_s < 0.12 and 0.179 < slow_s < 0.3  # generous tops: the build machine is shared
    assert 2.2 < slow_s / fast_s < 3.1


def test_a_speed_factor_and_a_live_throttle_divide_the_modeled_time(tiny_model, tmp_path):
    stage = Stage.load(tiny_model, 0, 3, kv_tokens=256)
    decode = Batch(seq_ids=[1], start_positions=[10], lengths=[1])
    catalog = Pacer(stage, Emulation(memory_bandwidth_gbs=2.0, fp16_tflops=1.0)).modeled_s(decode)
    slower_card = Pacer(stage, Emulation(memory_bandwidth_gbs=2.0, fp16_tflops=1.0, speed_factor=0.5))
    assert slower_card.modeled_s(decode) == 2 * catalog
    knob = tmp_path / "gpu0.json"
    now = [0.0]
    pacer = Pacer(stage, Emulation(2.0, 1.0, throttle_file=str(knob)), clock=lambda: now[0])
    assert pacer.modeled_s(decode) == catalog  # no file yet: full speed
    knob.write_text(json.dumps({"factor": 0.25}))
    now[0] += 0.5
    assert pacer.modeled_s(decode) == catalog  # the file is looked at once a second, not per step
    now[0] += 0.5
    assert pacer.modeled_s(decode) == 4 * catalog
    knob.write_text("{not json")  # caught mid-rewrite: the last good factor holds
    os.utime(knob, ns=(time.time_ns(), time.time_ns() + 10**9))
    now[0] += 1
    assert pacer.modeled_s(decode) == 4 * catalog
    knob.write_text(json.dumps({"factor": 1.0}))
    os.utime(knob, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    now[0] += 1
    assert pacer.modeled_s(decode) == catalog  # recovered
    knob.unlink()
    now[0] += 1
    assert pacer.modeled_s(decode) == catalog


def test_a_throttled_stage_really_sleeps_longer_and_recovers(tiny_model, tmp_path):
    torch.set_num_threads(1)
    stage = Stage.load(tiny_model, 0, 3, kv_tokens=256)
    scale = 0.05 / Pacer(stage, Emulation(1.0, 1.0, 1.0)).modeled_s(Batch([1], [0], [4]))  # 50 ms a step
    knob = tmp_path / "gpu0.json"
    knob.write_text(json.dumps({"factor": 1.0}))
    now = [0.0]
    pacer = Pacer(stage, Emulation(1.0, 1.0, scale, throttle_file=str(knob)), clock=lambda: now[0])
    full_s = min(timed_step(stage, pacer, 1) for _ in range(3))
    knob.write_text(json.dumps({"factor": 0.5}))
    os.utime(knob, ns=(time.time_ns(), time.time_ns() + 10**9))
    now[0] += 1
    throttled_s = min(timed_step(stage, pacer, 2) for _ in range(3))
    knob.write_text(json.dumps({"factor": 1.0}))
    os.utime(knob, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    now[0] += 1
    recovered_s = min(timed_step(stage, pacer, 3) for _ in range(3))
    assert 0.049 < full_s < 0.1 and 0.099 < throttled_s < 0.2  # generous tops: the build machine is shared
    assert 1.7 < throttled_s / full_s < 2.3 and recovered_s < 0.75 * throttled_s


def test_a_copy_back_from_the_host_tier_is_paced_by_the_cards_host_link(tiny_model):
    """16-bit K and V of the stage's layers over ``host_link_gbs``, times ``time_scale``; the card's
    speed factor does not slow its link, and a spec without the figure leaves copies unpaced."""
    stage = Stage.load(tiny_model, 1, 4, kv_tokens=256)
    config = ModelConfig.from_file(tiny_model)
    per_token = 3 * 2 * config.num_kv_heads * config.head_dim * 2
    link = Pacer(stage, Emulation(2.0, 1.0, time_scale=10.0, host_link_gbs=0.001, speed_factor=0.5))
    assert link.copy_s(100) == pytest.approx(10.0 * 100 * per_token / 1e6)
    assert Pacer(stage, Emulation(2.0, 1.0)).copy_s(100) == 0.0
    slept = link.pace_copy(1, 0.0)
    assert slept == pytest.approx(link.copy_s(1)) and link.pace_copy(1, 1.0) == 0.0
