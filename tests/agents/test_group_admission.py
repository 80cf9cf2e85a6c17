"""A tensor-parallel stage is admitted as a unit: every rank on its own device of this node, each held to
that device's budget by its share of the stage, paced like a stage of that device, and counted there
for the stages admitted after it and in the node's device telemetry."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.admission import Admission
from agents.discovery.emulated import EmulatedMetrics
from agents.memory_budget import StageRefused, rank_footprints, spec_footprint
from agents.throttle import Throttles
from contracts.footprint import usable_bytes
from contracts.hardware import GIB, DeviceSpec
from contracts.stage_spec import Emulation, StageSpec, TensorRank
from tests.agents.helpers import stage_spec, tiny_model

CARD = DeviceSpec(name="box/gpu0", node="box", index=0, model="T4", memory_bytes=GIB,
                  memory_bandwidth_gbs=320.0, fp16_tflops=65.0, bf16_tflops=65.0, int8_tops=130.0,
                  emulated=True, speed_factor=0.5)
DEVICES = (CARD, replace(CARD, name="box/gpu1", index=1, speed_factor=0.8))
PACED = Emulation(memory_bandwidth_gbs=320.0, fp16_tflops=65.0, time_scale=20.0)


def group_spec(tmp_path, memory_mib: int = 100, second: int = 1) -> StageSpec:
    """Stage 1 of the tiny model (4 kv heads, 512 MLP columns) split 3 + 1 heads over devices 0 and
    ``second``, each rank paced as the control plane writes it."""
    ranks = (TensorRank("cpu", 3, 384, 16, 0, PACED), TensorRank("cpu", 1, 128, 16, second, PACED))
    raw = stage_spec(tiny_model(tmp_path / "model"), memory_mib=memory_mib, emulation=None)
    return replace(StageSpec.from_dict(raw), emulation=PACED, tensor_group=ranks)


def test_a_group_is_admitted_with_each_rank_paced_and_charged_on_its_own_device(tmp_path):
    spec = group_spec(tmp_path)
    throttles = Throttles(tmp_path / "throttle", DEVICES)
    admitted = Admission(DEVICES, throttles=throttles).admit(spec, [], device_index=0)
    need = [footprint.total_bytes for footprint in rank_footprints(spec)]
    assert (admitted.device_index, admitted.memory_bytes) == (0, need[0])
    assert admitted.group_held == ((1, need[1]),)
    assert [admitted.bytes_on(i) for i in (0, 1, 2)] == [need[0], need[1], 0]
    ranks = admitted.spec.tensor_group
    assert [(r.device, r.device_index, r.kv_heads, r.intermediate) for r in ranks] == [
        ("cpu", 0, 3, 384), ("cpu", 1, 1, 128)]
    # Each rank's card as only this node knows it: its own speed and throttle file.
    assert [(r.emulation.speed_factor, r.emulation.throttle_file) for r in ranks] == [
        (0.5, str(throttles.path(0))), (0.8, str(throttles.path(1)))]
    assert admitted.spec.emulation == ranks[0].emulation and admitted.spec.rank_spec(0) == admitted.spec
    admitted.spec.validate()
    # The node's telemetry shows each rank's bytes on its own device.
    memory = [m.memory_used_bytes for m in EmulatedMetrics(DEVICES).sample([admitted.usage((0.0, 0.0, 0.0),
                                                                                             alive=True)])]
    assert memory == need


def test_a_rank_that_does_not_fit_refuses_the_whole_stage_naming_the_rank(tmp_path):
    spec = group_spec(tmp_path)
    need = rank_footprints(spec)[1].total_bytes
    small = replace(DEVICES[1], memory_used_bytes=usable_bytes(DEVICES[1]) - need + 1)
    with pytest.raises(StageRefused, match=r"^tensor_group rank 1 \(device index 1\): does not fit on "
                                           r"emulated box/gpu1"):
        Admission((DEVICES[0], small)).admit(spec, [], device_index=0)
    with pytest.raises(StageRefused, match=r"^tensor_group rank 1 \(device index 5\): device index 5 does "
                                           r"not exist on this node \(2 device\(s\)\)"):
        Admission(DEVICES).admit(group_spec(tmp_path, second=5), [], device_index=0)


def test_a_stage_admitted_after_a_group_sees_what_its_ranks_hold(tmp_path):
    admission = Admission(DEVICES)
    group = admission.admit(group_spec(tmp_path), [], device_index=0)
    alone = StageSpec.from_dict(stage_spec(tiny_model(tmp_path / "model"), memory_mib=100))
    room = usable_bytes(DEVICES[1]) - group.bytes_on(1)
    fits = replace(alone, kv_tokens=alone.kv_tokens + (room - spec_footprint(alone).total_bytes) // 1024)
    assert 0 <= room - admission.admit(fits, [group], device_index=1).memory_bytes < 1024  # a KV token
    with pytest.raises(StageRefused, match=r"does not fit on emulated box/gpu1"):
        admission.admit(replace(fits, kv_tokens=fits.kv_tokens + 1), [group], device_index=1)

def test_a_second_group_sees_the_first_ones_ranks(tmp_path):
    spec = group_spec(tmp_path)
    need = rank_footprints(spec)[1].total_bytes
    one_rank = replace(DEVICES[1], memory_used_bytes=usable_bytes(DEVICES[1]) - need - need // 2)
    admission = Admission((DEVICES[0], one_rank))
    group = admission.admit(spec, [], device_index=0)
    with pytest.raises(StageRefused, match=r"^tensor_group rank 1 .* [\d.]+ MiB held by other stages"):
        admission.admit(spec, [group], device_index=0)
