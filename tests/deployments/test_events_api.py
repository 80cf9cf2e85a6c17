"""GET /api/v1/events/: the stored events, newest first, filtered, for authenticated callers only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.deployments.events import event_record
from controlplane.deployments.models import DeploymentEvent
from controlplane.deployments.services import deployment_create, deployment_stop
from tests.api.mixins import APIResourceTests

URL = "/api/v1/events/"
Kind = DeploymentEvent.Kind


class TestEventAPI(APIResourceTests):
    url = URL
    actions = frozenset({"list", "retrieve"})

    def make_rows(self, n):
        return [event_record(kind=Kind.NODE_SUSPECT, node=f"n{i}", message=f"node n{i} is suspect")
                for i in range(n)]

    def create_data(self):
        return {"kind": "ready", "message": "forged"}

    def update_data(self):
        return {"message": "rewritten"}


@pytest.mark.django_db(transaction=True)
def test_a_deployments_events_newest_first_and_the_filters(api, anonymous, nodes, revision, sent):
    deployment = deployment_create(name="tiny", revision=revision)
    deployment_stop(deployment=deployment)
    event_record(kind=Kind.THROTTLED, device="n1/gpu0", message="n1/gpu0 throttled",
                 detail={"sm_clock_mhz": 900})
    assert anonymous.get(URL, {"deployment": deployment.pk}).status_code == 401

    body = api.get(URL, {"deployment": deployment.pk}).json()
    assert [(e["kind"], e["message"]) for e in body["results"]] == [
        ("stopping", "stop requested"), ("applied", "plan revision 1 applied (edited by an operator)")]
    newest = body["results"][0]
    assert newest["deployment_name"] == "tiny" and newest["kind_display"] == "Stop requested"

    throttled = api.get(URL, {"device": "n1/gpu0"}).json()["results"]
    assert [(e["kind"], e["node"], e["deployment"], e["detail"]) for e in throttled] == [
        ("throttled", "n1", None, {"sm_clock_mhz": 900})]
    fleet = api.get(URL, {"fleet": "true"}).json()["results"]
    assert {e["kind"] for e in fleet} == {"throttled", "node_registered"}
    assert [e["kind"] for e in api.get(URL, {"kind": ["stopping", "throttled"]}).json()["results"]] == [
        "throttled", "stopping"]
    later = (timezone.now() + timedelta(minutes=1)).isoformat()
    assert api.get(URL, {"since": later}).json()["count"] == 0
    assert api.get(URL, {"kind": "exploded"}).status_code == 400
