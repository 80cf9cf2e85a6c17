"""OTLP/HTTP protobuf (``ExportTraceServiceRequest``) to the rows of :class:`TraceSpan`: what a stage
posts to ``/api/v1/traces/otlp/``, and what the control plane's own spans are encoded to on their way
to the same store (``store.StoreExporter``), so both take one path."""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

MAX_TEXT = 200  # a name or status message longer than its column is cut


class OtlpError(ValueError):
    """A body that is not an ``ExportTraceServiceRequest``."""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return None if kind is None else getattr(value, kind)


def _attributes(pairs) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def message_spans(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """Each span of ``request`` as the fields of a ``TraceSpan`` (no ``received_at``)."""
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise OtlpError(f"span {span.name!r}: a trace id of 16 bytes and a span id of 8 expected")
                spans.append({
                    "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(), "name": span.name[:MAX_TEXT],
                    "start_ns": span.start_time_unix_nano, "end_ns": span.end_time_unix_nano,
                    "status_code": span.status.code, "status_message": span.status.message[:MAX_TEXT],
                    "attributes": _attributes(span.attributes), "resource": resource,
                    "events": [{"name": event.name, "time_ns": event.time_unix_nano,
                                "attributes": _attributes(event.attributes)} for event in span.events],
                })
    return spans


def decode(body: bytes) -> list[dict[str, Any]]:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise OtlpError(f"not an OTLP ExportTraceServiceRequest (protobuf): {exc}") from None
    return message_spans(request)
