"""The per-deployment speculation switch and ceiling: set on create, changed by PATCH, sent to running
stages in place, like the prefix caching switch (test_prefix_caching.py)."""

from __future__ import annotations

import pytest

from contracts.stage_spec import MAX_SPECULATIVE_TOKENS, respec_blocker
from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment
from controlplane.deployments.reconcile import deployment_reconcile
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES
from tests.deployments.test_prefix_caching import URL, _running
from tests.deployments.test_reconcile import starts

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


def test_lookup_on_create_reaches_every_spec(api, nodes, llm, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
            "speculation": "lookup", "speculative_tokens": 6}
    response = api.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    assert (response.json()["speculation"], response.json()["speculative_tokens"]) == ("lookup", 6)
    specs = Deployment.objects.get().stages.values_list("spec", flat=True)
    assert [(s["speculation"], s["speculative_tokens"]) for s in specs] == [("lookup", 6)] * 3
    created = AuditEntry.objects.get(action="deployment.created").detail
    assert (created["speculation"], created["speculative_tokens"]) == ("lookup", 6)


def test_off_by_default(api, nodes, llm, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST}
    assert api.post(URL, body, format="json").json()["speculation"] == "off"
    specs = Deployment.objects.get().stages.values_list("spec", flat=True)
    assert {(s["speculation"], s["speculative_tokens"]) for s in specs} == {("off", 4)}


def test_patch_rewrites_every_stage_spec_in_place(api, nodes, revision, sent):
    deployment = _running(revision, sent)
    was = {row.stage_key: row.spec for row in deployment.stages.all()}
    response = api.patch(f"{URL}{deployment.pk}/", {"speculation": "lookup", "speculative_tokens": 8},
                         format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["speculation"], response.json()["speculative_tokens"]) == ("lookup", 8)
    assert sent.reconciles == [deployment.pk] and sent.tasks == []
    rows = {row.stage_key: row for row in deployment.stages.all()}
    assert {key: row.spec for key, row in rows.items()} == {
        key: {**spec, "speculation": "lookup", "speculative_tokens": 8} for key, spec in was.items()}
    deployment_reconcile(deployment_id=deployment.pk)
    started = starts(sent.take())
    assert all(respec_blocker(was[key], spec) is None for key, (_, spec) in started.items())  # no reload
    event = deployment.events.get(kind="handover_started")
    assert "speculation lookup, at most 8 proposed tokens per step" in event.message
    entry = AuditEntry.objects.get(action="deployment.updated")
    assert entry.detail == {"speculation": ["off", "lookup"], "speculative_tokens": [4, 8]}


def test_the_ceiling_alone_is_written_too(api, nodes, revision, sent):
    deployment = _running(revision, sent, speculation="lookup")
    assert api.patch(f"{URL}{deployment.pk}/", {"speculative_tokens": 2}, format="json").status_code == 200
    assert {row.spec["speculative_tokens"] for row in deployment.stages.all()} == {2}
    assert sent.reconciles == [deployment.pk]


def test_patching_the_values_it_has_sends_nothing(api, nodes, revision, sent):
    deployment = _running(revision, sent)
    body = {"speculation": "off", "speculative_tokens": 4}
    patched = api.patch(f"{URL}{deployment.pk}/", body, format="json")
    assert patched.status_code == 200
    assert sent.reconciles == [] and not AuditEntry.objects.filter(action="deployment.updated").exists()


@pytest.mark.parametrize("body, field", [
    ({"speculation": "draft-ish"}, "speculation"),
    ({"speculative_tokens": 0}, "speculative_tokens"),
    ({"speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, "speculative_tokens"),
    ({"speculative_tokens": "many"}, "speculative_tokens"),
])
def test_a_bad_value_is_a_400_naming_the_field_and_changes_nothing(api, nodes, revision, sent, body, field):
    deployment = _running(revision, sent)
    assert_error(api.patch(f"{URL}{deployment.pk}/", body, format="json"), 400, field)
    deployment = Deployment.objects.get()
    assert (deployment.speculation, deployment.speculative_tokens) == ("off", 4) and sent.reconciles == []


def test_a_bad_value_on_create_is_a_400_naming_the_field(api, nodes, llm, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST, "speculation": "yes"}
    assert_error(api.post(URL, body, format="json"), 400, "speculation")
    assert not Deployment.objects.exists()
