"""The supervisor with the real stage process (``python -m worker_runtime.serve``) on an emulated device:
a tiny demo checkpoint loads, reports ready and statistics, is paced like the card, and drains on stop."""

from __future__ import annotations

import json

import pytest

from agents.admission import Admission
from agents.discovery.emulated import emulated_devices
from agents.supervisor import Supervisor
from contracts.stage_spec import spec_digest
from tests.agents.helpers import Events, wait_until
from tests.support.processes import free_port

pytestmark = pytest.mark.slow


def one_stage_spec(demo_model, bits: int = 16) -> dict:
    address = f"tcp://127.0.0.1:{free_port()}"
    return {"pipeline_id": "d5-r0", "auth_token": "secret", "model_path": str(demo_model), "stage_index": 0,
            "num_stages": 1, "layers": [0, 2], "bits": bits, "dtype": None, "device": "cpu", "threads": 1,
            "kv_tokens": 256, "listen": address, "next": None, "head": address, "peer_timeout_s": 2.0,
            "emulation": None}


def test_a_real_stage_starts_reports_and_drains(tmp_path, tiny_fleet, demo_model):
    events = Events()
    admission = Admission(emulated_devices(tiny_fleet, "box"), time_scale=2.0)
    supervisor = Supervisor(tmp_path / "state", admission, events)
    spec = one_stage_spec(demo_model)
    try:
        status = supervisor.start("d5-r0-s0", spec, device_index=0)
        assert status.state == "starting", status.message
        written = json.loads((tmp_path / "state/stages/d5-r0-s0/spec.json").read_text())
        assert written["emulation"] == {"memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0, "time_scale": 2.0,
                                        "speed_factor": 1.0, "throttle_file": None, "host_link_gbs": None}
        events.wait_for(lambda s: s.state == "ready", timeout_s=60)
        stats = wait_until(lambda: supervisor.snapshot()[0][0].stats, timeout_s=10, what="a stats line")
        assert {"step_ms", "tokens_per_s", "kv_tokens_free", "steps"} <= set(stats)
    finally:
        stopped = supervisor.stop("d5-r0-s0")
        supervisor.close()
    assert (stopped.state, stopped.exit_code) == ("exited", 0), stopped.message


def test_a_quantized_stage_keeps_its_layers_in_the_agents_weight_cache(tmp_path, tiny_fleet, demo_model):
    """The agent hands its stage processes ``stages/_weights/`` (``MOTLEY_WEIGHT_CACHE``): a quantized
    CPU stage leaves its layers and lm_head there for the next process that loads them."""
    events = Events()
    supervisor = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events)
    try:
        supervisor.start("d5-r0-s0", one_stage_spec(demo_model, bits=8), device_index=0)
        events.wait_for(lambda s: s.state == "ready", timeout_s=60)
    finally:
        supervisor.close()
    assert len(list((tmp_path / "state/stages/_weights").glob("*.safetensors"))) == 3  # 2 layers, lm_head


def test_a_new_spec_the_process_can_take_is_taken_in_place_and_another_address_needs_a_new_one(
        tmp_path, tiny_fleet, demo_model):
    """A changed precision and KV pool go to the running process (same pid, ``ready`` again for the new
    spec, which the report names); a new address cannot, so that start replaces the process."""
    events = Events()
    supervisor = Supervisor(tmp_path / "state", Admission(emulated_devices(tiny_fleet, "box")), events)
    spec = one_stage_spec(demo_model)
    try:
        first = supervisor.start("d5-r0-s0", spec, device_index=0)
        events.wait_for(lambda s: s.state == "ready", timeout_s=60)
        pid = supervisor.snapshot()[0][0].pid
        quantized = {**spec, "bits": 8, "kv_tokens": 128}
        status = supervisor.start("d5-r0-s0", quantized, device_index=0)
        assert (status.state, status.pid) == ("starting", pid)
        assert status.spec_digest == spec_digest(quantized) != first.spec_digest
        ready = events.wait_for(lambda s: s.state == "ready" and s.spec_digest == status.spec_digest,
                                timeout_s=60)
        assert ready.pid == pid
        address = f"tcp://127.0.0.1:{free_port()}"
        moved = {**quantized, "listen": address, "head": address}
        supervisor.start("d5-r0-s0", moved, device_index=0)
        ready = events.wait_for(lambda s: s.state == "ready" and s.spec_digest == spec_digest(moved),
                                timeout_s=60)
        assert ready.pid != pid
    finally:
        supervisor.close()
