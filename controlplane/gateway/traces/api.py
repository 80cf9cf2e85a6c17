"""The trace store's API: ``GET /api/v1/traces/`` (recent traces), ``GET /api/v1/traces/<trace id>/``
(one trace's spans, as the dashboard's waterfall draws them), and ``POST /api/v1/traces/otlp/``, the
OTLP/HTTP protobuf receiver the stages export to (docs/observability.md, "Request timeline").

The receiver takes no user or node credential: a stage holds neither, on whatever node it runs. It
signs with its pipeline's token (``Authorization: Pipeline <pipeline id>:<token>``,
contracts/tracing.py), which the control plane made for that pipeline and checks here: a pipeline of
the deployments (any phase, so an outgoing one's last spans still come), or of the models file when
one is set.
"""

from __future__ import annotations

import hmac
import re
import zlib

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from contracts.names import parse_pipeline_id
from contracts.tracing import sink_credentials
from controlplane.deployments.models import DeploymentPipeline
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.serving.directory import served_models_from_file
from controlplane.gateway.traces.otlp import OtlpError, decode
from controlplane.gateway.traces.selectors import trace_detail, trace_list
from controlplane.gateway.traces.store import trace_spans_store

TRACE_ID = re.compile(r"[0-9a-f]{32}")


class TraceListView(APIView):
    @extend_schema(operation_id="v1_traces_list", responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        """``{"traces": [{"trace_id", "name", "start_ns", "duration_s", "spans", "error", "outcome",
        "model", "tracing_ui_url"}]}``: the most recent kept traces, newest first."""
        return Response({"traces": trace_list()})


class TraceDetailView(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, trace_id: str) -> Response:
        """``{"trace_id", "start_ns", "tracing_ui_url", "spans": [{"span_id", "parent_span_id", "name",
        "depth", "offset_s", "duration_s", "status_code", "attributes", "events", "resource"}]}``: each
        span after its parent, times from the trace's start."""
        if not TRACE_ID.fullmatch(trace_id):
            raise ValidationError({"trace_id": "32 lowercase hex digits"})
        if (trace := trace_detail(trace_id=trace_id)) is None:
            raise NotFound(f"no span of trace {trace_id} is kept (sampled out, unexported, or aged out)")
        return Response(trace)


def _pipeline_token(pipeline_id: str) -> str | None:
    if gateway_setting("MODELS_FILE"):
        return next((replica.auth_token for model in served_models_from_file() for replica in model.replicas
                     if replica.pipeline_id == pipeline_id), None)
    if (parts := parse_pipeline_id(pipeline_id)) is None:
        return None
    return DeploymentPipeline.objects.filter(deployment_id=parts[0], index=parts[1]).values_list(
        "auth_token", flat=True).first()


def _error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": {"message": message}}, status=status)


def _body(request: HttpRequest) -> bytes:
    """The body, inflated where the exporter compressed it (``OTEL_EXPORTER_OTLP_COMPRESSION``), to at
    most the API's body limit."""
    body, limit = request.body, settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if request.headers.get("Content-Encoding", "").lower() == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        body = inflater.decompress(body, limit + 1)
        if len(body) > limit:
            raise OtlpError(f"the inflated body is over {limit} bytes")
    return body


@csrf_exempt  # no cookie: the pipeline's token in a header
@require_POST
def otlp_receive(request: HttpRequest) -> HttpResponse:
    """OTLP/HTTP protobuf spans of a stage, kept in the trace store; 401 without its pipeline's token."""
    credentials = sink_credentials(request.headers.get("Authorization", ""))
    token = _pipeline_token(credentials[0]) if credentials else None
    if token is None or not hmac.compare_digest(token.encode(), credentials[1].encode()):
        return _error(401, "Authorization: Pipeline <pipeline id>:<its token> of a pipeline this control "
                           "plane runs")
    if request.content_type != "application/x-protobuf":
        return _error(415, "Content-Type: application/x-protobuf (OTLP/HTTP protobuf; JSON is not taken)")
    try:
        trace_spans_store(spans=decode(_body(request)))
    except (OtlpError, zlib.error) as exc:
        return _error(400, str(exc))
    answer = ExportTraceServiceResponse().SerializeToString()
    return HttpResponse(answer, content_type="application/x-protobuf")
