"""A plan with a tensor-parallel group is refused by name until the stage runtime serves groups."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from controlplane.deployments.revisions import plan_revision_check, plan_revision_create
from tests.deployments.conftest import REQUEST, THREE_STAGES, edited_plan


def test_a_plan_with_a_tensor_parallel_group_is_refused_naming_the_stage(nodes, llm):
    plan = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 6))
    plan["replicas"][0]["stages"][1]["group"] = [
        {"device": "n1/gpu0", "kv_heads": 1, "columns": 64, "bits": 16},
        {"device": "n2/gpu0", "kv_heads": 1, "columns": 64, "bits": 16}]
    revision = plan_revision_create(model=llm, plan=plan, request=REQUEST, source="edited")
    with pytest.raises(ValidationError) as refused:
        plan_revision_check(revision=revision)
    messages = refused.value.message_dict["plan"]
    assert messages == ["replica 0 stage 1 (n1/gpu0 + 1 more on layers [2, 6)): "
                        "tensor-parallel groups are planned but not yet served"]


def test_a_plan_without_groups_is_still_checked_as_before(nodes, llm):
    revision = plan_revision_create(model=llm, plan=THREE_STAGES, request=REQUEST, source="edited")
    checked = plan_revision_check(revision=revision)
    assert [len(replica) for replica in checked.replicas] == [3]
