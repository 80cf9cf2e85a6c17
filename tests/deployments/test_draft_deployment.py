"""Speculation "draft": the draft model deployed as a deployment of its own where the planner places it
(a card the target leaves spare), linked from every stage spec of the target, followed when its
pipeline changes, stopped with the target or when speculation turns away from it
(docs/deployments.md, "Draft model")."""

from __future__ import annotations

import json

import pytest

from controlplane.audit.models import AuditEntry
from controlplane.deployments.models import Deployment
from controlplane.deployments.reconcile import deployment_reconcile
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.services import deployment_apply
from controlplane.models_catalog.services import model_register
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, THREE_STAGES, TINY_CONFIG, edited_plan
from tests.deployments.test_prefix_caching import URL, _running
from tests.deployments.test_reconcile import ready_all

pytestmark = pytest.mark.django_db(transaction=True)  # sends happen on commit, as in production


def registered(tmp_path, name: str, **config):
    checkpoint = tmp_path / name
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({**TINY_CONFIG, **config}))
    (checkpoint / "model.safetensors").write_bytes(b"")
    return model_register(path=checkpoint, name=name)


@pytest.fixture
def small(db, tmp_path):
    """A two-layer model with the tiny model's vocabulary: a draft for it."""
    return registered(tmp_path, "small", num_hidden_layers=2)


def links(deployment: Deployment) -> list[dict | None]:
    return [row.spec.get("draft") for row in deployment.stages.filter(wanted=True).order_by("stage_index")]


def draft_head(draft: Deployment) -> dict:
    """The link to the draft's serving pipeline, from its head stage's spec."""
    serving = draft.pipelines.filter(phase="serving").values_list("index", flat=True)
    row = draft.stages.get(wanted=True, stage_index=0, pipeline__in=serving or [0])
    return {"address": row.spec["listen"], "pipeline_id": row.spec["pipeline_id"],
            "auth_token": row.spec["auth_token"]}


def test_create_deploys_the_draft_on_the_spare_card_and_links_every_stage(api, nodes, llm, small, sent):
    body = {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
            "speculation": "draft", "draft_model": small.pk}
    response = api.post(URL, body, format="json")
    assert response.status_code == 201, response.content
    target = Deployment.objects.get(name="tiny")
    draft = target.draft_deployment
    assert (response.json()["draft_deployment"], response.json()["draft_deployment_name"]) == (
        draft.pk, "tiny-draft") and draft.name == "tiny-draft"
    (stage,) = draft.stages.filter(wanted=True)
    assert stage.device.name == "n3/gpu0" and stage.spec["layers"] == [0, 2]  # the card the target leaves
    assert draft.speculation == "off" and draft.revision.source == "planner"
    assert links(target) == [draft_head(draft)] * 3
    assert {row.spec["speculation"] for row in target.stages.all()} == {"draft"}
    assert AuditEntry.objects.get(action="deployment.created", target_id=str(target.pk)
                                  ).detail["draft_deployment"] == "tiny-draft"


@pytest.mark.parametrize("body, message", [
    ({"speculation": "draft"}, "needs a draft_model"),
    ({"speculation": "draft", "draft_model": "other-vocab"}, "vocabulary"),
    ({"speculation": "draft", "draft_model": "tiny"}, "another, smaller model"),
    ({"speculation": "lookup", "draft_model": "small"}, 'serves only speculation "draft"'),
])
def test_a_bad_draft_is_a_400_naming_draft_model_and_creates_nothing(api, nodes, llm, small, tmp_path, sent,
                                                                      body, message):
    other = registered(tmp_path, "other", vocab_size=512)
    models = {"small": small.pk, "tiny": llm.pk, "other-vocab": other.pk}
    if "draft_model" in body:
        body = {**body, "draft_model": models[body["draft_model"]]}
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              **body}, format="json")
    assert_error(response, 400, "draft_model", message)
    assert not Deployment.objects.exists()


def test_no_spare_card_is_a_400_naming_draft_model(api, nodes, llm, small, sent):
    four = edited_plan(("n0/gpu0", 0, 2), ("n1/gpu0", 2, 3), ("n2/gpu0", 3, 4), ("n3/gpu0", 4, 6))
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": four, "request": REQUEST,
                              "speculation": "draft", "draft_model": small.pk}, format="json")
    assert_error(response, 400, "draft_model", "no card for the draft model")
    assert not Deployment.objects.exists()


def test_patch_turns_the_draft_on_and_off_and_stop_takes_it_along(api, nodes, revision, small, sent):
    target = _running(revision, sent, speculation="lookup")
    response = api.patch(f"{URL}{target.pk}/", {"speculation": "draft", "draft_model": small.pk},
                         format="json")
    assert response.status_code == 200, response.content
    target.refresh_from_db()
    draft = target.draft_deployment
    assert links(target) == [draft_head(draft)] * 3
    assert AuditEntry.objects.filter(action="deployment.updated").last().detail["draft_deployment"] == [
        None, "tiny-draft"]

    assert api.patch(f"{URL}{target.pk}/", {"speculation": "lookup"}, format="json").status_code == 200
    target.refresh_from_db()
    draft.refresh_from_db()
    assert target.draft_deployment is None and draft.stop_requested
    assert links(target) == [None] * 3 and {r.spec["speculation"] for r in target.stages.all()} == {"lookup"}

    api.patch(f"{URL}{target.pk}/", {"speculation": "draft", "draft_model": small.pk}, format="json")
    target.refresh_from_db()
    second = target.draft_deployment
    assert second.name == "tiny-draft-2" and links(target) == [draft_head(second)] * 3
    assert api.post(f"{URL}{target.pk}/stop/").status_code == 200
    second.refresh_from_db()
    assert second.stop_requested


def test_the_controller_follows_the_draft_to_its_new_pipeline(api, nodes, llm, small, sent):
    response = api.post(URL, {"name": "tiny", "model": llm.pk, "plan": THREE_STAGES, "request": REQUEST,
                              "speculation": "draft", "draft_model": small.pk}, format="json")
    target = Deployment.objects.get(pk=response.json()["id"])
    draft = target.draft_deployment
    for deployment in (draft, target):
        deployment_reconcile(deployment_id=deployment.pk)
        ready_all(deployment)
        deployment_reconcile(deployment_id=deployment.pk)
    was = draft_head(draft)
    # the draft moves to 8 bits: a new pipeline beside the old one, under a new id and address
    moved = edited_plan(("n3/gpu0", 0, 2))
    moved["replicas"][0]["stages"][0]["bits"] = 8
    deployment_apply(deployment=draft, revision=plan_revision_create(
        model=small, plan=moved, request={**REQUEST, "max_quantized": 1.0}, source="edited",
        deployment=draft))
    assert links(target) == [was] * 3  # the old pipeline serves until the new one does
    sent.reconciles.clear()
    for _ in range(3):  # the new pipeline reports ready, takes over, the old one leaves
        deployment_reconcile(deployment_id=draft.pk)
        ready_all(draft)
    now = draft_head(draft)
    assert now != was and sent.reconciles and set(sent.reconciles) <= {draft.pk, target.pk}
    assert target.pk in sent.reconciles  # the draft's pass asked for the target's
    deployment_reconcile(deployment_id=target.pk)
    assert links(target) == [now] * 3
