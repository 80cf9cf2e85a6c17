"""Baselines (even and memory-proportional splits) and the planner against them on the example fleets."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.planning import PlanningError, PlanRequest, Workload, baseline_plan, plan
from tests.planning.factories import fleet, profile

ROOT = Path(__file__).resolve().parents[2]
FLEET_DIR = ROOT / "examples" / "fleets"
FLEETS = sorted(FLEET_DIR.glob("*.y*ml")) + sorted(FLEET_DIR.glob("*.json"))
MODELS = ["Llama-2-7B", "Llama-3-8B", "Qwen2.5-32B", "Llama-2-70B"]


def test_even_and_memory_splits():
    request = PlanRequest(fleet({"n": ["A100", "A10"]}), profile(30), Workload(4, 1024))
    groups = [["n/gpu0", "n/gpu1"]]
    even = baseline_plan(request, "even", groups)
    assert [s.layers for s in even.replicas[0].stages] == [(0, 15), (15, 30)]
    memory = baseline_plan(request, "memory", groups)
    a100, a10 = memory.replicas[0].stages
    assert a100.end - a100.start > a10.end - a10.start
    assert even.kind == "even" and memory.kind == "memory"


def test_baseline_that_cannot_fit_is_infeasible():
    request = PlanRequest(fleet({"n": ["T4", "T4"]}), profile(32, layer_params=400_000_000),
                          Workload(8, 4096),
                          max_quantized=0.0)
    with pytest.raises(PlanningError, match="baseline infeasible"):
        baseline_plan(request, "even", [["n/gpu0"]])


def _example_models():
    """The published configs, and the demo model `make run` deploys (the demo fleet is sized for it)."""
    from contracts.model_config import ModelConfig
    from worker_runtime.make_demo_model import build_tokenizer, demo_config, parse_args

    tokenizer = build_tokenizer()
    demo = demo_config(parse_args(["unused"]), tokenizer.get_vocab_size(), tokenizer)
    yield "motley-demo", ModelConfig.from_dict(demo)
    for name in MODELS:
        yield name, ModelConfig.from_file(ROOT / "examples" / "models" / name)


@pytest.mark.parametrize("fleet_file", FLEETS, ids=lambda p: p.stem)
def test_planner_never_worse_than_baselines_on_example_fleets(fleet_file):
    load_fleet_file = pytest.importorskip("contracts.fleet_file").load_fleet_file
    profile_model = pytest.importorskip("contracts.profiler").profile_model

    fleet_spec = load_fleet_file(fleet_file)
    compared = 0
    for name, config in _example_models():
        model = profile_model(config, name)
        request = PlanRequest(fleet_spec, model, Workload(batch=8, context=2048))
        try:
            own = plan(request)
        except PlanningError:
            continue  # the model does not fit this fleet at all: no baseline does either
        groups = [[s.device for s in r.stages] for r in own.replicas]
        for kind in ("even", "memory"):
            try:
                other = baseline_plan(request, kind, groups)
            except PlanningError:
                continue  # the baseline cannot hold the model on these devices within the budget
            compared += 1
            ours, theirs = own.predicted.decode_tokens_per_s, other.predicted.decode_tokens_per_s
            assert ours >= theirs * (1 - 1e-9), (name, kind)
    assert compared > 0
