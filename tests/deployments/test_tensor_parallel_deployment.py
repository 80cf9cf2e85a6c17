"""A plan stage that is a tensor-parallel group deploys as one stage row and one spec: its ranks listed in
the spec's ``tensor_group`` (rank 0's process starts the others on its node), its devices checked and
held like a stage's own, each rank sized on its own card by the make-before-break room test."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from contracts.footprint import RESERVED_BYTES, RESERVED_FRACTION
from contracts.model_profile import ModelProfile
from contracts.stage_spec import StageSpec
from controlplane.deployments.revisions import plan_revision_check, plan_revision_create
from controlplane.deployments.room import room_shortfalls, spec_holdings
from controlplane.deployments.services import deployment_create
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory.models import Device
from tests.deployments.conftest import REQUEST, T4, edited_plan

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pair(nodes, sent):
    """A node ``g`` with two emulated T4s, beside the conftest's one-card nodes."""
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    node = agent_register(join_token=secret, name="g", address="127.0.0.1", emulated=True,
                          devices=[T4, T4]).node
    sent.take()
    return node


def grouped_plan(first: str = "g/gpu0", second: str = "g/gpu1"):
    """Stage 0 on n0's card, stage 1 (layers [2, 6)) split over ``first`` and ``second``, a kv head and
    64 of the tiny model's 128 MLP columns each."""
    plan = edited_plan(("n0/gpu0", 0, 2), (first, 2, 6))
    plan["replicas"][0]["stages"][1]["group"] = [
        {"device": first, "kv_heads": 1, "columns": 64, "bits": 16},
        {"device": second, "kv_heads": 1, "columns": 64, "bits": 16}]
    return plan


def test_a_group_stage_runs_as_one_stage_whose_spec_lists_its_ranks(pair, llm):
    Device.objects.filter(node=pair, index=1).update(memory_bandwidth_gbs=250.0)  # a slower second card
    revision = plan_revision_create(model=llm, plan=grouped_plan(), request=REQUEST, source="edited")
    deployment = deployment_create(name="tp", revision=revision)
    rows = list(deployment.stages.order_by("stage_index"))
    assert [(row.stage_index, row.device.name) for row in rows] == [(0, "n0/gpu0"), (1, "g/gpu0")]
    spec = StageSpec.from_dict(rows[1].spec)  # a spec the worker takes
    assert (spec.device, spec.host_kv_tokens, rows[0].spec["tensor_group"]) == ("cpu", 0, [])
    assert [(r.device, r.device_index, r.kv_heads, r.intermediate, r.bits) for r in spec.tensor_group] == [
        ("cpu", 0, 1, 64, 16), ("cpu", 1, 1, 64, 16)]
    # Each rank paced to its own card, as the stage's own emulation is built.
    assert spec.tensor_group[0].emulation == spec.emulation is not None
    assert spec.tensor_group[1].emulation == replace(spec.emulation, memory_bandwidth_gbs=250.0)
    assert spec.rank_spec(0) == spec


def refusals(llm, plan) -> list[str]:
    revision = plan_revision_create(model=llm, plan=plan, request=REQUEST, source="edited")
    with pytest.raises(ValidationError) as refused:
        plan_revision_check(revision=revision)
    return refused.value.message_dict["plan"]


def test_a_group_its_process_could_not_run_is_refused_naming_the_stage(pair, llm):
    """The what-if check's group rules (controlplane/planning/validate_group.py) refuse it at deploy."""
    (across,) = refusals(llm, grouped_plan("n1/gpu0", "g/gpu1"))
    assert across.startswith("replica 0 stage 1 (n1/gpu0): rank 1 (g/gpu1) is on node g, not on n1")
    swapped = grouped_plan()
    swapped["replicas"][0]["stages"][1]["device"] = "g/gpu1"
    assert any("first rank is g/gpu0, not the stage's device" in m for m in refusals(llm, swapped))
    twice = grouped_plan("g/gpu0", "g/gpu0")
    assert any("g/gpu0 is 2 ranks of the group" in m for m in refusals(llm, twice))


def test_a_groups_other_rank_is_a_device_in_use(pair, llm):
    first = plan_revision_create(model=llm, plan=grouped_plan(), request=REQUEST, source="edited")
    deployment_create(name="tp", revision=first)
    other = plan_revision_create(model=llm, plan=edited_plan(("n1/gpu0", 0, 3), ("g/gpu1", 3, 6)),
                                 request=REQUEST, source="edited")
    with pytest.raises(ValidationError) as refused:
        plan_revision_check(revision=other)
    assert refused.value.message_dict["plan"] == ["device g/gpu1 carries a stage of deployment tp"]


def test_the_room_test_counts_each_rank_on_its_own_card(pair, llm):
    revision = plan_revision_create(model=llm, plan=grouped_plan(), request=REQUEST, source="edited")
    deployment = deployment_create(name="tp", revision=revision)
    row = deployment.stages.get(stage_index=1)
    profile = ModelProfile.from_dict(llm.profile)
    (_, rank0), (_, rank1) = holdings = spec_holdings(profile, row.spec)
    assert [index for index, _ in holdings] == [0, 1] and rank0 > 0 and rank1 > 0
    assert room_shortfalls(profile=profile, new=[(row.device, row.spec)]) == []
    # gpu1 made to hold one rank 1 and half another: a second copy of the group fits beside on gpu0 only.
    usable = rank1 + rank1 // 2
    Device.objects.filter(node=pair, index=1).update(
        memory_bytes=int((usable + RESERVED_BYTES) / (1 - RESERVED_FRACTION)) + 1)
    shortfalls = room_shortfalls(profile=profile, new=[(row.device, row.spec)])
    assert len(shortfalls) == 1 and shortfalls[0].startswith("g/gpu1 needs ")
    # Its own row excluded, the group alone fits.
    assert room_shortfalls(profile=profile, new=[(row.device, row.spec)], exclude=frozenset({row.pk})) == []
