"""The what-if check of an edited tensor-parallel group over HTTP: the shares are priced when they are
sound, and refused, each problem named, when they are not (docs/dashboard.md, "Plan editor")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controlplane.deployments.models import PlanRevision
from controlplane.planning import check, plan, plan_to_dict
from controlplane.plans.selectors import plan_request_from_inventory

VALIDATE = "/api/v1/plans/validate/"
HEADS, COLUMNS = 8, 14336  # Llama-3-8B: key-value heads, intermediate size (448 int4 groups of 32)


def _one_group(*shares) -> dict:
    """A plan of one stage holding all 32 layers on a group of node-a's A100s (NVLink island)."""
    group = [{"device": d, "kv_heads": h, "columns": c, "bits": b} for d, h, c, b in shares]
    return {"replicas": [{"stages": [{"device": group[0]["device"], "layers": [0, 32], "bits": 16,
                                      "group": group}]}]}


def _check(api, model, plan: dict) -> dict:
    """The what-if answer for ``plan``, with any layer allowed below 16 bits: a layer counts at the lowest
    precision any rank holds it at, so one 4-bit rank puts the whole stage in the quality budget."""
    response = api.post(VALIDATE, {"model": model.id, "replicas": 1, "plan": plan, "max_quantized": 1.0},
                        format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_an_edited_group_is_priced_with_its_shares(api, lab, llama3_8b):
    even = _check(api, llama3_8b, _one_group(("node-a/gpu0", 4, 7168, 16), ("node-a/gpu1", 4, 7168, 16)))
    assert even["valid"], even["problems"]
    stage = even["predicted"]["replicas"][0]["stages"][0]
    assert stage["group"] == [{"device": "node-a/gpu0", "kv_heads": 4, "columns": 7168, "bits": 16},
                              {"device": "node-a/gpu1", "kv_heads": 4, "columns": 7168, "bits": 16}]
    assert stage["group_link"]["kind"] == "nvlink"
    # Uneven shares on equal cards: accepted, and the slower rank sets a longer step.
    uneven = _check(api, llama3_8b, _one_group(("node-a/gpu0", 6, 10752, 16), ("node-a/gpu1", 2, 3584, 16)))
    assert uneven["valid"], uneven["problems"]
    step = uneven["predicted"]["replicas"][0]["stages"][0]["predicted"]["step_ms"]
    assert step > stage["predicted"]["step_ms"]
    assert uneven["predicted"]["predicted"]["decode_tokens_per_s"] < even["predicted"]["predicted"][
        "decode_tokens_per_s"]
    # A rank at 4 bits with whole int4 groups (7168 = 224 x 32) is priced too: its weights shrink.
    quantized = _check(api, llama3_8b, _one_group(("node-a/gpu0", 4, 7168, 16), ("node-a/gpu1", 4, 7168, 4)))
    assert quantized["valid"], quantized["problems"]
    memory = quantized["predicted"]["replicas"][0]["stages"][0]["memory"]
    assert memory["weights_bytes"] < stage["memory"]["weights_bytes"]


@pytest.mark.parametrize("shares, message", [
    ((("node-a/gpu0", 4, 7168, 16), ("node-a/gpu1", 3, 7168, 16)),
     "replica 0 stage 0 (node-a/gpu0): the ranks' kv heads sum to 7, the model has 8 (4+3)"),
    ((("node-a/gpu0", 4, 7168, 16), ("node-a/gpu1", 4, 7000, 16)),
     "replica 0 stage 0 (node-a/gpu0): the ranks' MLP columns sum to 14168, the model's intermediate size "
     "is 14336 (7168+7000)"),
    ((("node-a/gpu0", 4, 7168, 16), ("node-b/gpu0", 4, 7168, 16)),
     "replica 0 stage 0 (node-a/gpu0): rank 1 (node-b/gpu0) is on node node-b, not on node-a with the "
     "group's first rank: a group's ranks share one node"),
    ((("node-a/gpu0", 4, 7150, 16), ("node-a/gpu1", 4, 7186, 4)),
     "replica 0 stage 0 (node-a/gpu0): rank 1 (node-a/gpu1) holds MLP columns [7150, 14336) at 4 bits, not "
     "whole int4 groups of 32 (each rank's columns a multiple of 32)"),
    ((("node-a/gpu0", 8, 14336, 16),),
     "replica 0 stage 0 (node-a/gpu0): a tensor-parallel group needs two or more ranks, it has 1"),
])
def test_bad_shares_are_refused_with_the_problem_named(api, lab, llama3_8b, shares, message):
    body = _check(api, llama3_8b, _one_group(*shares))
    assert not body["valid"]
    assert [(p["code"], p["message"]) for p in body["problems"]] == [("bad_group", message)]
    assert body["predicted"] is None  # shares that do not add up cannot be priced


def test_a_rank_on_a_device_of_another_stage_is_reused(api, lab, llama3_8b):
    plan = _one_group(("node-a/gpu0", 4, 7168, 16), ("node-a/gpu1", 4, 7168, 16))
    plan["replicas"][0]["stages"][0]["layers"] = [0, 16]
    plan["replicas"][0]["stages"].append({"device": "node-a/gpu1", "layers": [16, 32], "bits": 16})
    body = _check(api, llama3_8b, plan)
    assert {(p["code"], p["stage"]) for p in body["problems"]} == {("device_reused", 0), ("device_reused", 1)}
    assert "its rank node-a/gpu1 carries 2 stages" in body["problems"][0]["message"]


def test_the_planners_own_groups_pass_the_check(lab, llama3_8b):
    """The check holds an operator's shares to the rules the planner makes its own by."""
    request = replace(plan_request_from_inventory(model=llama3_8b, request={"replicas": 1}),
                      tensor_parallel=True)
    planned = plan(request)
    assert any(stage.group for replica in planned.replicas for stage in replica.stages)
    problems, priced = check(plan_to_dict(planned), request)
    assert problems == [] and priced is not None


def test_the_plans_api_asks_for_groups_and_a_saved_revision_keeps_the_question(api, lab, llama3_8b):
    """``tensor_parallel`` reaches the planner through the API (off: one card per stage) and stays in the
    saved revision's request, so a re-plan after a failure asks the same; a value that is no boolean is
    a 400 naming the field."""
    body = {"model": llama3_8b.id, "replicas": 1, "batch": 1, "objective": "latency"}
    grouped = api.post("/api/v1/plans/", {**body, "tensor_parallel": True, "save": True}, format="json")
    assert grouped.status_code == 201, grouped.content
    assert any(s.get("group") for r in grouped.json()["replicas"] for s in r["stages"])
    assert PlanRevision.objects.get(pk=grouped.json()["revision"]).request["tensor_parallel"] is True
    plain = api.post("/api/v1/plans/", body, format="json")
    assert plain.status_code == 200, plain.content
    assert not any(s.get("group") for r in plain.json()["replicas"] for s in r["stages"])
    refused = api.post("/api/v1/plans/", {**body, "tensor_parallel": "sometimes"}, format="json")
    assert refused.status_code == 400 and "tensor_parallel" in refused.json()["error"]["details"]
