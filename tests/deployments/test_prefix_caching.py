"""The per-deployment prefix caching switch: set on create, changed by PATCH, sent to running stages."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from contracts.stage_spec import respec_blocker
from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.services import deployment_create
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES
from tests.deployments.test_reconcile import ready_all, starts

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production
URL = "/api/v1/deployments/"


def _running(revision, sent, **options) -> Deployment:
    """A deployment whose stages were all started and reported ready."""
    deployment = deployment_create(name="tiny", revision=revision, **options)
    deployment_reconcile(deployment_id=deployment.pk)
    ready_all(deployment)
    deployment_reconcile(deployment_id=deployment.pk)
    sent.take()
    sent.reconciles.clear()
    return deployment


def test_off_on_create_reaches_every_spec(api, nodes, llm, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
            "prefix_caching": False}
    response = api.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["prefix_caching"] is False
    specs = Deployment.objects.get().stages.values_list("spec", flat=True)
    assert [spec["prefix_caching"] for spec in specs] == [False] * 3


def test_patch_rewrites_every_stage_spec_and_the_reconcile_sends_them_in_place(api, nodes, revision, sent):
    deployment = _running(revision, sent)
    was = {row.stage_key: row.spec for row in deployment.stages.all()}
    assert deployment.prefix_caching and {spec["prefix_caching"] for spec in was.values()} == {True}
    response = api.patch(f"{URL}{deployment.pk}/", {"prefix_caching": False}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["prefix_caching"] is False
    assert sent.reconciles == [deployment.pk] and sent.tasks == []  # the controller sends, after commit
    rows = {row.stage_key: row for row in deployment.stages.all()}
    assert {key: row.spec for key, row in rows.items()} == {
        key: {**spec, "prefix_caching": False} for key, spec in was.items()}
    deployment_reconcile(deployment_id=deployment.pk)
    started = starts(sent.take())
    assert {key: spec for key, (_, spec) in started.items()} == {key: row.spec for key, row in rows.items()}
    assert all(respec_blocker(was[key], spec) is None for key, (_, spec) in started.items())  # no reload
    # Not routed to while its stages rejoin (the pause), then serving again: no request sent into it.
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.DEPLOYING
    assert sent.take() == [] and deployment.pipelines.get().phase == "reloading"
    ready_all(deployment, pid_base=200)
    assert deployment_reconcile(deployment_id=deployment.pk).status == Deployment.Status.READY
    assert deployment.pipelines.get().phase == "serving"
    started, done = (deployment.events.get(kind=kind) for kind in ("handover_started", "handover_done"))
    assert "prefix caching turned off" in started.message and started.detail["starting"] == sorted(was)
    assert "serves again" in done.message
    entry = AuditEntry.objects.get(action="deployment.updated")
    assert entry.detail == {"prefix_caching": [True, False]}


def test_patching_the_value_it_has_sends_nothing_and_records_nothing(api, nodes, revision, sent):
    deployment = _running(revision, sent, prefix_caching=False)
    assert api.patch(f"{URL}{deployment.pk}/", {"prefix_caching": False}, format="json").status_code == 200
    assert sent.reconciles == [] and not AuditEntry.objects.filter(action="deployment.updated").exists()


def test_an_outgoing_pipeline_keeps_its_spec_and_a_prepared_one_gets_it(api, nodes, revision, sent):
    deployment = _running(revision, sent)
    head = deployment.stages.get(stage_index=0)
    head.next_spec = {**head.spec, "kv_tokens": 512}
    head.save(update_fields=["next_spec"])
    api.patch(f"{URL}{deployment.pk}/", {"prefix_caching": False}, format="json")
    head.refresh_from_db()
    assert head.next_spec == {**head.spec, "kv_tokens": 512} and head.spec["prefix_caching"] is False
    deployment.pipelines.update(phase="outgoing")
    api.patch(f"{URL}{deployment.pk}/", {"prefix_caching": True}, format="json")
    assert {row.spec["prefix_caching"] for row in deployment.stages.all()} == {False}


def test_a_bad_value_is_a_400_naming_the_field_and_changes_nothing(api, nodes, revision, sent):
    deployment = _running(revision, sent)
    assert_error(api.patch(f"{URL}{deployment.pk}/", {"prefix_caching": "maybe"}, format="json"), 400,
                 "prefix_caching")
    assert Deployment.objects.get().prefix_caching and sent.reconciles == []


def test_a_plain_user_cannot_switch_it(nodes, revision, sent, django_user_model):
    deployment = _running(revision, sent)
    plain = APIClient()
    plain.force_authenticate(django_user_model.objects.create_user("plain"))
    refused = plain.patch(f"{URL}{deployment.pk}/", {"prefix_caching": False}, format="json")
    assert refused.status_code == 403 and "'operators' group" in refused.json()["error"]["message"]
    assert {row.spec["prefix_caching"] for row in deployment.stages.all()} == {True}
    assert plain.get(f"{URL}{deployment.pk}/").json()["prefix_caching"] is True
