"""The agent admits exactly what the planner placed: `make run`'s demo model planned on the demo fleet,
each stage's spec built as the deployments controller builds it, admitted by the agents of the demo
nodes on their emulated cards; one KV token beyond the planner's figure is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.admission import Admission, Admitted
from agents.discovery.emulated import emulated_devices
from agents.memory_budget import StageRefused
from contracts.model_config import ModelConfig
from contracts.profiler import profile_model
from contracts.stage_spec import StageSpec
from controlplane.planning import PlanRequest, Workload, plan, plan_to_dict

REPO = Path(__file__).resolve().parents[2]
DEMO_FLEET = REPO / "examples" / "fleets" / "demo.yaml"
DEMO_WORKLOAD = Workload(batch=16, context=2048)  # controlplane.ops.demo.DEMO_REQUEST


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory) -> Path:
    """The demo checkpoint's config.json (all the planner and the agent read of it)."""
    from worker_runtime.make_demo_model import build_tokenizer, demo_config, parse_args

    tokenizer = build_tokenizer()
    path = tmp_path_factory.mktemp("motley-demo")
    (path / "config.json").write_text(json.dumps(demo_config(parse_args(["unused"]),
                                                             tokenizer.get_vocab_size(),
                                                             tokenizer)))
    return path


def planned_specs(model: Path, fleet, replicas: int | str = 1):
    """(node, device index, spec, planned kv_tokens) per stage of the planner's plan, the spec as
    the controller writes it for an emulated device (its KV capped at the workload's need)."""
    profile = profile_model(ModelConfig.from_file(model), name="motley-demo")
    planned = plan_to_dict(plan(PlanRequest(fleet, profile, DEMO_WORKLOAD, replicas=replicas)))
    need = planned["batch"] * planned["context"]
    for r, replica in enumerate(planned["replicas"]):
        stages = replica["stages"]
        for index, stage in enumerate(stages):
            device = fleet.device(stage["device"])
            spec = {
                "pipeline_id": f"d1-r{r}", "auth_token": "t", "model_path": str(model),
                "stage_index": index, "num_stages": len(stages), "layers": stage["layers"],
                "bits": stage["bits"], "low_bits": stage.get("low_bits"), "low_from": stage.get("low_from"),
                "dtype": None, "device": "cpu", "threads": 1, "kv_tokens": min(stage["kv_tokens"], need),
                "batch": planned["batch"], "listen": "tcp://127.0.0.1:1", "head": "tcp://127.0.0.1:1",
                "next": None if index == len(stages) - 1 else "tcp://127.0.0.1:2", "peer_timeout_s": 5.0,
                "emulation": None,
            }
            yield device.node, device.index, spec, stage["kv_tokens"]


def test_every_stage_the_planner_places_on_the_demo_fleet_is_admitted_and_one_token_more_is_not(demo_model):
    from contracts.fleet_file import load_fleet_file

    fleet = load_fleet_file(DEMO_FLEET)
    admissions = {node.name: Admission(emulated_devices(DEMO_FLEET, node.name)) for node in fleet.nodes}
    admitted: dict[str, list[Admitted]] = {node.name: [] for node in fleet.nodes}
    stages = list(planned_specs(demo_model, fleet))
    # the demo splits
    assert len(stages) > 1 and any(s["bits"] < 16 or s["low_bits"] for _, _, s, _ in stages)
    for node, index, spec, planned_kv in stages:
        admission = admissions[node]
        # As the controller sends it (KV capped at the workload's need), next to the stages already there.
        admitted[node].append(admission.admit(StageSpec.from_dict(spec), admitted[node], index))
        # With all the KV the planner gave it, on the real card's capacity: admitted, and not a token more.
        alone = admission.admit(StageSpec.from_dict({**spec, "kv_tokens": planned_kv}), [], index)
        assert alone.device_index == index
        with pytest.raises(StageRefused, match="does not fit"):
            admission.admit(StageSpec.from_dict({**spec, "kv_tokens": planned_kv + 1}), [], index)
