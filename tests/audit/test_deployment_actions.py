"""Deployment and plan actions record who did them, from where, on what; refused ones record nothing."""

from __future__ import annotations

import pytest
from django.db import transaction
from rest_framework.test import APIClient

from controlplane.audit.models import AuditEntry
from controlplane.audit.services import Actor
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_create
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES, edited_plan

pytestmark = pytest.mark.django_db
URL = "/api/v1/deployments/"
MOVED = edited_plan(("n0/gpu0", 0, 3), ("n1/gpu0", 3, 4), ("n2/gpu0", 4, 6))


def only_entry(**expected) -> AuditEntry:
    entries = list(AuditEntry.objects.all())
    assert len(entries) == 1, [(e.action, e.target_label) for e in entries]
    entry = entries[0]
    for field, value in expected.items():
        assert getattr(entry, field) == value, (field, getattr(entry, field))
    return entry


@pytest.fixture
def fleet(nodes, llm):
    """The registered fleet and model, their own entries (node.registered, model.registered) cleared."""
    AuditEntry.objects.all().delete()  # a queryset delete: tests only
    return nodes


@pytest.fixture
def browser(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def test_create_records_the_token_user_and_address(api, user, fleet, llm):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST, "source": "edited"}
    response = api.post(URL, body, format="json", REMOTE_ADDR="203.0.113.5")
    assert response.status_code == 201, response.content
    deployment = Deployment.objects.get()
    entry = only_entry(action="deployment.created", actor=user, actor_label="alice", via="token",
                       remote_addr="203.0.113.5", target_type="deployment", target_id=str(deployment.pk),
                       target_label="tiny")
    assert entry.detail["model"] == "tiny" and entry.detail["source"] == "edited"


def test_a_refused_create_records_nothing(api, fleet, llm):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": edited_plan(("n0/gpu0", 0, 5)),
                              "request": REQUEST}, format="json")
    assert_error(response, 400, "layer")
    assert not AuditEntry.objects.exists()


def test_a_rolled_back_create_records_nothing(fleet, revision, user):
    with pytest.raises(RuntimeError), transaction.atomic():
        deployment_create(name="tiny", revision=revision, actor=Actor(user=user, label="alice", via="cli"))
        assert AuditEntry.objects.count() == 1
        raise RuntimeError("the caller gave up")
    assert not AuditEntry.objects.exists() and not Deployment.objects.exists()


def test_internal_callers_record_the_system(fleet, revision):
    deployment_create(name="tiny", revision=revision)
    only_entry(action="deployment.created", actor=None, actor_label="system", via="system", remote_addr=None)


@pytest.fixture
def deployment(fleet, revision):
    deployment = deployment_create(name="tiny", revision=revision)
    AuditEntry.objects.all().delete()  # the creation's entry
    return deployment


def test_an_edited_plan_applied_from_the_browser_is_plan_edited(browser, user, deployment):
    body = {"plan": MOVED, "request": REQUEST, "source": "edited"}
    response = browser.post(f"{URL}{deployment.pk}/apply/", body, format="json", REMOTE_ADDR="198.51.100.9")
    assert response.status_code == 200, response.content
    entry = only_entry(action="plan.edited", actor=user, via="session", remote_addr="198.51.100.9",
                       target_type="deployment", target_id=str(deployment.pk))
    applied = Deployment.objects.get().revision
    assert entry.detail == {"revision": applied.pk, "number": 2, "source": "edited",
                            "previous_revision": deployment.revision_id}


def test_the_planners_proposal_applied_is_proposal_accepted(api, deployment):
    body = {"plan": MOVED, "request": REQUEST, "source": "planner"}  # the editor's Rebalance, unchanged
    assert api.post(f"{URL}{deployment.pk}/apply/", body, format="json").status_code == 200
    only_entry(action="plan.proposal_accepted", actor_label="alice", via="token")


def test_another_revision_applied_by_id_is_plan_applied(api, deployment, llm):
    draft = plan_revision_create(model=llm, plan=MOVED, request=REQUEST, source=PlanRevision.Source.REPLAN,
                                 deployment=deployment)
    assert api.post(f"{URL}{deployment.pk}/apply/", {"revision": draft.pk}, format="json").status_code == 200
    assert only_entry(action="plan.applied").detail["revision"] == draft.pk


def test_a_refused_apply_records_nothing(api, deployment):
    short = {"plan": edited_plan(("n0/gpu0", 0, 5))}
    response = api.post(f"{URL}{deployment.pk}/apply/", short, format="json")
    assert_error(response, 400, "layer")
    assert not AuditEntry.objects.exists()


def test_update_records_what_changed_and_a_no_op_nothing(api, deployment):
    url = f"{URL}{deployment.pk}/"
    assert api.patch(url, {"replan_on_failure": True}, format="json").status_code == 200  # already so
    assert not AuditEntry.objects.exists()
    assert api.patch(url, {"replan_on_failure": False}, format="json").status_code == 200
    only_entry(action="deployment.updated", actor_label="alice", detail={"replan_on_failure": [True, False]})
    assert_error(api.patch(url, {"routing_strategy": "nope"}, format="json"), 400, "routing_strategy")
    assert AuditEntry.objects.count() == 1


def test_stop_is_recorded_once(api, user, deployment):
    for _ in range(2):
        assert api.post(f"{URL}{deployment.pk}/stop/").status_code == 200
    only_entry(action="deployment.stopped", actor=user, target_label="tiny")
