"""The control plane's trace store: a stage's OTLP/HTTP export and the gateway's own spans kept and
read back as one trace's tree, the receiver's refusals, and the store's bounds
(tests/gateway/test_live.py follows a request through a real pipeline into it)."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from contracts.fleet_file import load_fleet_file
from contracts.tracing import sink_authorization
from controlplane.deployments.models import DeploymentPipeline
from controlplane.gateway.traces.models import TraceSpan
from controlplane.gateway.traces.store import StoreExporter
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, running_deployment_create
from tests.support.trace_samples import request_trace

pytestmark = pytest.mark.django_db
OTLP = "/api/v1/traces/otlp/"
TOKEN = "pipeline-secret"


@pytest.fixture
def pipelines(settings, tmp_path):
    """A models file naming pipeline p0 with its token: what the receiver checks a stage against."""
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": [{"name": "demo", "tokenizer_path": "/nowhere", "replicas": [
        {"pipeline_id": "p0", "head_address": "tcp://127.0.0.1:1", "auth_token": TOKEN}]}]}))
    settings.MOTLEY_GATEWAY_MODELS_FILE = str(path)


def export(client, body: bytes, authorization: str = sink_authorization("p0", TOKEN), **headers):
    return client.post(OTLP, body, content_type=headers.pop("content_type", "application/x-protobuf"),
                       HTTP_AUTHORIZATION=authorization, **headers)


def test_a_stages_export_and_the_gateways_spans_read_back_as_one_tree(client, admin_client, pipelines,
                                                                      settings):
    settings.MOTLEY_TRACING_UI_URL = "http://jaeger:16686/trace/{trace_id}"
    sample = request_trace()
    assert StoreExporter().export(sample.gateway).name == "SUCCESS"
    response = export(client, sample.stage_body())
    assert response.status_code == 200 and response["Content-Type"] == "application/x-protobuf"
    assert export(client, sample.stage_body()).status_code == 200  # a retried batch is kept once

    (listed,) = admin_client.get("/api/v1/traces/").json()["traces"]
    assert (listed["trace_id"], listed["name"], listed["spans"]) == (sample.trace_id, "gateway.request", 4)
    assert (listed["model"], listed["outcome"], listed["error"]) == ("demo", "completed", False)
    detail = admin_client.get(f"/api/v1/traces/{sample.trace_id}/").json()
    assert detail["tracing_ui_url"] == f"http://jaeger:16686/trace/{sample.trace_id}"
    spans = detail["spans"]
    assert [(s["name"], s["depth"]) for s in spans] == [
        ("gateway.request", 0), ("gateway.admission", 1), ("head.request", 1), ("stage.request", 2)]
    by_name = {s["name"]: s for s in spans}
    assert by_name["head.request"]["parent_span_id"] == by_name["gateway.request"]["span_id"]
    assert by_name["stage.request"]["parent_span_id"] == by_name["head.request"]["span_id"]
    assert by_name["head.request"]["resource"]["motley.stage"] == "p0/0"
    assert by_name["head.request"]["attributes"] == {"motley.prompt_tokens": 5}
    assert [e["name"] for e in by_name["head.request"]["events"]] == ["first_token"]
    assert all(s["offset_s"] >= 0 and s["duration_s"] >= 0 for s in spans)
    assert spans[0]["offset_s"] == 0 and spans[0]["duration_s"] >= by_name["head.request"]["duration_s"]


def test_the_receiver_takes_only_a_served_pipelines_token_and_protobuf(client, pipelines):
    body = request_trace().stage_body()
    for authorization in ("", f"Bearer {TOKEN}", sink_authorization("p0", "wrong"),
                          sink_authorization("p1", TOKEN)):
        assert export(client, body, authorization).status_code == 401
    assert export(client, body, content_type="application/json").status_code == 415
    garbled = export(client, b"\xff\x00 not a protobuf")
    assert garbled.status_code == 400 and "ExportTraceServiceRequest" in garbled.json()["error"]["message"]
    assert not TraceSpan.objects.exists()
    assert export(client, gzip.compress(body), HTTP_CONTENT_ENCODING="gzip").status_code == 200
    assert TraceSpan.objects.count() == 2


def test_a_deployed_pipelines_token_is_taken(client, settings):
    """Without a models file, the deployments' pipelines (whatever their phase) are checked."""
    settings.MOTLEY_GATEWAY_MODELS_FILE = None
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    running_deployment_create(model=model_register(path=LLAMA3_8B))
    pipeline = DeploymentPipeline.objects.first()
    body = request_trace().stage_body()
    assert export(client, body, sink_authorization(pipeline.pipeline_id, "wrong")).status_code == 401
    signed = sink_authorization(pipeline.pipeline_id, pipeline.auth_token)
    assert export(client, body, signed).status_code == 200


def test_the_store_keeps_the_newest_spans_and_none_too_old(settings, admin_client):
    settings.MOTLEY_TRACE_SPANS_KEPT = 3
    first, second = request_trace(), request_trace(failed=True)
    StoreExporter().export(first.gateway + first.stage)
    assert TraceSpan.objects.count() == 3  # the oldest of the four went
    too_old = timezone.now() - timedelta(seconds=settings.MOTLEY_TRACE_MAX_AGE_S + 1)
    TraceSpan.objects.update(received_at=too_old)
    StoreExporter().export(second.gateway)
    assert set(TraceSpan.objects.values_list("trace_id", flat=True)) == {second.trace_id}
    StoreExporter().export(second.stage)
    (listed,) = admin_client.get("/api/v1/traces/").json()["traces"]
    assert (listed["outcome"], listed["error"]) == ("failed:broken", True)  # the head's span failed
    settings.MOTLEY_TRACE_SPANS_KEPT = 0
    StoreExporter().export(first.gateway)
    assert not TraceSpan.objects.filter(trace_id=first.trace_id).exists()


def test_a_trace_is_asked_for_by_its_id(admin_client):
    assert admin_client.get("/api/v1/traces/nope/").status_code == 400
    missing = admin_client.get(f"/api/v1/traces/{'0' * 32}/")
    assert missing.status_code == 404 and "sampled out" in missing.json()["error"]["message"]
