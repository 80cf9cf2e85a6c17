"""The controller's stage specs are ``contracts.stage_spec.StageSpec``s: what a worker accepts, priced
as the plan."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from contracts.stage_spec import StageSpec
from controlplane.deployments.models import Deployment
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from controlplane.planning import plan, plan_to_dict
from controlplane.plans.selectors import plan_request_from_inventory
from tests.deployments.conftest import REQUEST, edited_plan

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


def stored_specs(deployment: Deployment) -> list[StageSpec]:
    """Every wanted stage's stored spec, read back the way the agent's worker reads it."""
    rows = deployment.stages.filter(wanted=True).order_by("pipeline", "stage_index")
    return [StageSpec.from_dict(row.spec) for row in rows]


def test_a_planners_plan_is_stored_as_valid_stage_specs_priced_as_planned(nodes, llm, sent):
    planned = plan_to_dict(plan(plan_request_from_inventory(model=llm, request=REQUEST)))
    revision = plan_revision_create(model=llm, plan=planned, request=REQUEST, source="planner")
    deployment = deployment_create(name="tiny", revision=revision)
    specs = stored_specs(deployment)
    stages = [(replica, stage) for replica in planned["replicas"] for stage in replica["stages"]]
    assert len(specs) == len(stages) >= 1
    workload_kv = planned["batch"] * planned["context"]
    for spec, (replica, stage) in zip(specs, stages):
        assert spec.batch == planned["batch"] == REQUEST["batch"]
        assert list(spec.layers) == stage["layers"]
        assert (spec.bits, spec.low_bits, spec.low_from) == (stage["bits"], stage.get("low_bits"),
                                                            stage.get("low_from"))
        # Emulated cards share the host's RAM: the workload's KV, not all the modeled card's memory.
        assert spec.kv_tokens == min(stage["kv_tokens"], workload_kv)
        assert spec.micro_batches == (replica["micro_batches"] if spec.is_head else None)
        assert spec.device == "cpu" and spec.emulation is not None
        # A tiny model's prefill costs more per token than its KV's copy over PCIe: the plan's host tier,
        # capped like the KV pool, and copies paced to the card's PCIe figure (gen4 x16).
        assert spec.host_kv_tokens == min(stage["host_kv_tokens"], workload_kv) > 0
        assert spec.emulation.host_link_gbs == pytest.approx(0.985 * 2 * 16)
    # A spec round-trips through the contract unchanged: what is stored is what a worker runs.
    row = deployment.stages.filter(wanted=True).first()
    assert StageSpec.from_dict(row.spec).to_json() == row.spec


def test_an_edited_plan_with_a_low_bit_tail_is_stored_as_valid_stage_specs(nodes, llm, sent):
    edited = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 4), ("n2/gpu0", 4, 6))
    edited["replicas"][0]["stages"][2].update(low_bits=4, low_from=5)
    revision = plan_revision_create(model=llm, plan=edited, request=REQUEST, source="edited")
    specs = stored_specs(deployment_create(name="tiny", revision=revision))
    assert [list(s.layers) for s in specs] == [[0, 2], [2, 4], [4, 6]]
    precisions = [(s.bits, s.low_bits, s.low_from) for s in specs]
    assert precisions == [(16, None, None), (16, None, None), (16, 4, 5)]
    assert {s.batch for s in specs} == {REQUEST["batch"]}
    assert {s.kv_tokens for s in specs} == {REQUEST["batch"] * REQUEST["context"]}
    assert specs[0].micro_batches >= 1 and [s.micro_batches for s in specs[1:]] == [None, None]


def test_a_spec_the_worker_would_refuse_is_refused_at_the_controller(nodes, revision, settings, sent):
    settings.MOTLEY_STAGE_THREADS = 0
    with pytest.raises(ValidationError, match="threads"):
        deployment_create(name="tiny", revision=revision)
    assert not Deployment.objects.exists() and sent.tasks == [] and sent.reconciles == []


def test_no_host_memory_granted_no_host_tier_in_the_specs(nodes, llm, settings, sent):
    settings.MOTLEY_HOST_KV_GIB = 0
    planned = plan_to_dict(plan(plan_request_from_inventory(model=llm, request=REQUEST)))
    revision = plan_revision_create(model=llm, plan=planned, request=REQUEST, source="planner")
    specs = stored_specs(deployment_create(name="tiny", revision=revision))
    assert specs and {s.host_kv_tokens for s in specs} == {0}
