"""Service-level targets through the API (create, PATCH, validated) and the admin, and the demand endpoint."""

from __future__ import annotations

import time

import pytest
from django.db import IntegrityError, transaction

from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment
from controlplane.deployments.services import deployment_create
from controlplane.gateway.serving import decision_log
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES

pytestmark = pytest.mark.django_db(transaction=True)
URL = "/api/v1/deployments/"
TARGETS = {"ttft_target_ms": 800, "tpot_target_ms": 60, "target_percentile": 99, "target_window_s": 120,
           "priority": 5, "min_replicas": 1, "max_replicas": 3}


def test_create_with_targets_shows_them(api, nodes, llm, sent):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              **TARGETS}, format="json")
    assert response.status_code == 201, response.content
    assert {name: response.json()[name] for name in TARGETS} == TARGETS


def test_a_deployment_created_without_targets_has_none_and_the_defaults(api, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    shown = api.get(f"{URL}{deployment.pk}/").json()
    assert {name: shown[name] for name in TARGETS} == {
        "ttft_target_ms": None, "tpot_target_ms": None, "target_percentile": 95, "target_window_s": 300,
        "priority": 0, "min_replicas": 1, "max_replicas": None}


@pytest.mark.parametrize(("values", "field"), [
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({"target_percentile": 90}, "target_percentile"),
    ({"ttft_target_ms": 0}, "ttft_target_ms"),
    ({"tpot_target_ms": -5}, "tpot_target_ms"),
    ({"target_window_s": 5}, "target_window_s"),
    ({"min_replicas": 0}, "min_replicas"),
])
def test_create_refuses_targets_out_of_range_and_leaves_nothing(api, nodes, llm, sent, values, field):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              **values}, format="json")
    assert_error(response, 400, field)
    assert not Deployment.objects.exists()


def test_patch_changes_targets_checks_them_together_and_audits_the_change(api, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    url = f"{URL}{deployment.pk}/"
    response = api.patch(url, {"ttft_target_ms": 500, "min_replicas": 2, "max_replicas": 4, "priority": -1},
                         format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["ttft_target_ms"], body["min_replicas"], body["max_replicas"], body["priority"]) == (
        500, 2, 4, -1)
    audited = AuditEntry.objects.filter(action="deployment.updated").get()
    assert audited.detail["ttft_target_ms"] == [None, 500]
    assert_error(api.patch(url, {"max_replicas": 1}, format="json"), 400, "max_replicas")  # below min 2
    assert_error(api.patch(url, {"target_percentile": "50"}, format="json"), 400, "target_percentile")
    cleared = api.patch(url, {"ttft_target_ms": None, "max_replicas": None}, format="json").json()
    assert (cleared["ttft_target_ms"], cleared["max_replicas"], cleared["min_replicas"]) == (None, None, 2)


def test_the_database_refuses_least_above_most(nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    with pytest.raises(IntegrityError), transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(min_replicas=4, max_replicas=2)


def test_the_admin_edits_the_targets_and_validates_them(admin_client, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    url = f"/admin/deployments/deployment/{deployment.pk}/change/"
    assert 'name="ttft_target_ms"' in admin_client.get(url).content.decode()
    form = {"ttft_target_ms": "400", "tpot_target_ms": "", "target_percentile": "99", "target_window_s": "60",
            "priority": "2", "min_replicas": "2", "max_replicas": "1"}
    refused = admin_client.post(url, form)
    assert refused.status_code == 200 and "at least min_replicas" in refused.content.decode()
    assert admin_client.post(url, {**form, "max_replicas": "2"}).status_code == 302
    deployment.refresh_from_db()
    assert (deployment.ttft_target_ms, deployment.target_percentile, deployment.max_replicas) == (400, 99, 2)
    audited = AuditEntry.objects.filter(action="deployment.updated").get()
    assert audited.detail["max_replicas"] == [None, 2] and audited.via == "admin"


def test_demand_endpoint_answers_for_the_deployment(api, anonymous, nodes, revision, sent, monkeypatch):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment.ttft_target_ms = 200
    deployment.save(update_fields=["ttft_target_ms"])
    recorder = decision_log.RouterRecorder(started_at=time.time() - 600)  # serving for ten minutes
    monkeypatch.setattr("controlplane.gateway.demand.recorder", recorder)
    recorder.record(decision_log.RouteRecord("a", "tiny", "round_robin", time.time() - 1,
                                             f"d{deployment.pk}-r0", "running", prompt_tokens=40))
    recorder.first_token("a", 0.1)
    recorder.finished("a", "completed", 0.3, 5)
    url = f"{URL}{deployment.pk}/demand/"
    body = api.get(url).json()
    assert body["deployment"] == deployment.pk and body["requests"] == 1 and body["window_s"] == 300
    assert body["ttft"]["target_ms"] == 200 and body["ttft"]["attainment"] == 1.0
    assert body["prompt_tokens_per_s"] == pytest.approx(40 / 300, abs=1e-3)
    assert api.get(url, {"window_s": 60}).json()["window_s"] == 60
    assert_error(api.get(url, {"window_s": 1}), 400, "window_s")
    assert api.get(f"{URL}999999/demand/").status_code == 404
    assert anonymous.get(url).status_code == 401


def test_the_emergency_quality_budget_needs_a_measured_model_and_is_set_cleared_and_shown(
        api, admin_client, nodes, llm, revision, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
            "emergency_max_kl": 0.1}
    assert_error(api.post(URL, body, format="json"), 400, "emergency_max_kl",
                 f"run manage.py profile_quality {llm.name}")
    assert not Deployment.objects.exists()
    deployment = deployment_create(name="tiny", revision=revision)
    url = f"{URL}{deployment.pk}/"
    assert api.get(url).json()["emergency_max_kl"] is None  # the default: no lower precision
    assert_error(api.patch(url, {"emergency_max_kl": 0.1}, format="json"), 400, "profile_quality")

    llm.profile = {**llm.profile, "sensitivity": {"8": [0.01] * 6}}  # as profile_quality stores it
    llm.save(update_fields=["profile"])
    assert api.patch(url, {"emergency_max_kl": 0.1}, format="json").json()["emergency_max_kl"] == 0.1
    assert AuditEntry.objects.get(action="deployment.updated").detail["emergency_max_kl"] == [None, 0.1]
    assert_error(api.patch(url, {"emergency_max_kl": 0}, format="json"), 400, "emergency_max_kl", "positive")
    assert api.patch(url, {"emergency_max_kl": None}, format="json").json()["emergency_max_kl"] is None
    change = admin_client.get(f"/admin/deployments/deployment/{deployment.pk}/change/").content.decode()
    assert 'name="emergency_max_kl"' in change
    with pytest.raises(IntegrityError), transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(emergency_max_kl=-1.0)
