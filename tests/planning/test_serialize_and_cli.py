"""The JSON form of plans and the database-free CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.precision import Precision
from controlplane.planning import (
    Placement,
    PlanRequest,
    Workload,
    plan,
    plan_from_dict,
    plan_to_dict,
    replica_placements,
    stored_plan,
)
from tests.planning.factories import fleet, profile

ROOT = Path(__file__).resolve().parents[2]
FLEETS = ROOT / "examples" / "fleets"
MODELS = ROOT / "examples" / "models"


def test_round_trip_through_json():
    result = plan(PlanRequest(fleet({"a": ["A100", "T4"], "b": ["3090"]}), profile(24), Workload(8, 2048)))
    data = json.loads(json.dumps(plan_to_dict(result)))
    assert plan_from_dict(data) == result


def test_a_stored_plan_is_read_once_into_the_planners_types_full_or_only_placed():
    """A revision's plan is the planner's full JSON or an operator's edit (placements only): both give
    their placements, only the full one a ``Plan``."""
    result = plan(PlanRequest(fleet({"a": ["A100", "T4"]}), profile(24), Workload(8, 2048)))
    data = json.loads(json.dumps(plan_to_dict(result)))
    assert stored_plan(data) == result
    assert replica_placements(data) == tuple(tuple(s.placement for s in r.stages) for r in result.replicas)
    edited = {"replicas": [{"stages": [{"device": "a/gpu0", "layers": [0, 12], "bits": 16},
                                       {"device": "a/gpu1", "layers": [12, 24], "bits": 16, "low_bits": 4,
                                        "low_from": 20}]}]}
    assert stored_plan(edited) is None
    assert replica_placements(edited) == ((Placement("a/gpu0", 0, 12, 16),
                                           Placement.at("a/gpu1", 12, 24, Precision(16, 4, 20))),)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.planning", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not (FLEETS / "lab-3node.yaml").exists(), reason="example fleets not present")
def test_cli_prints_the_documented_schema():
    done = run_cli("plan", "--fleet", str(FLEETS / "lab-3node.yaml"), "--model", str(MODELS / "Llama-3-8B"),
                   "--batch", "8", "--context", "4096", "--bits", "16,8,4", "--max-quantized", "0.5",
                   "--replicas", "auto", "--host-kv-gib", "2", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["predicted"]["decode_tokens_per_s"] > 0
    assert data["bottleneck"]["device"] and isinstance(data["explanation"], list)
    assert any(line.startswith("Host KV tier: ") for line in data["explanation"])
    for replica in data["replicas"]:
        assert replica["predicted"]["decode_tokens_per_s"] > 0
        for stage in replica["stages"]:
            assert stage["device"].split("/")[1].startswith("gpu")
            start, end = stage["layers"]
            assert 0 <= start < end <= 32
            assert stage["bits"] in (16, 8, 4)
            if "low_bits" in stage:  # the stage's last layers at a lower precision
                assert stage["low_bits"] < stage["bits"] and start < stage["low_from"] < end
            assert stage["kv_tokens"] >= 8 * 4096
            assert stage["memory"]["total_bytes"] <= stage["memory"]["capacity_bytes"]
            assert stage["memory"]["host_kv_bytes"] <= 2 * 1024**3 and stage["host_kv_tokens"] >= 0
            assert stage["predicted"]["step_ms"] > 0
    baseline = run_cli("plan", "--fleet", str(FLEETS / "lab-3node.yaml"),
                       "--model", str(MODELS / "Llama-3-8B"), "--baseline", "even", "--replicas", "2",
                       "--json")
    assert baseline.returncode == 0, baseline.stderr
    assert json.loads(baseline.stdout)["kind"] == "even"


@pytest.mark.skipif(not (FLEETS / "workstation.yaml").exists(), reason="example fleets not present")
def test_cli_infeasible_exits_nonzero_with_the_reason():
    done = run_cli("plan", "--fleet", str(FLEETS / "workstation.yaml"),
                   "--model", str(MODELS / "Llama-2-70B"), "--json")
    assert done.returncode != 0
    assert done.stdout == ""
    assert "short by" in done.stderr and "GiB" in done.stderr


def test_cli_rejects_bad_input(tmp_path):
    done = run_cli("plan", "--fleet", str(tmp_path / "missing.yaml"), "--model", str(MODELS / "Llama-2-7B"))
    assert done.returncode != 0 and "error:" in done.stderr


def test_planner_imports_no_django():
    code = ("import sys, controlplane.planning, controlplane.planning.cli; "
            "assert 'django' not in sys.modules, sorted(m for m in sys.modules if 'django' in m)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
