"""A real OTLP/HTTP trace receiver for tests: decodes the exporters' ``ExportTraceServiceRequest``
protobufs (``opentelemetry-proto``, which the exporter depends on) and keeps every span it gets.

``with OtlpReceiver() as receiver:`` serves on a free loopback port; point a process at it with
``receiver.env()`` (the standard ``OTEL_*`` variables, with a short batch delay so a test waits
milliseconds for its spans) and wait for them with :meth:`OtlpReceiver.wait`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str
    parent_span_id: str  # "" for a root span
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    start_ns: int = 0
    end_ns: int = 0


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _attributes(pairs) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(ReceivedSpan(
                    span.name, span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                    _attributes(span.attributes), resource,
                    [(event.name, _attributes(event.attributes)) for event in span.events],
                    span.status.code, span.start_time_unix_nano, span.end_time_unix_nano,
                ))
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []  # each export's HTTP headers
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                spans = decode(body) if self.path == "/v1/traces" else None
                if spans is not None:
                    with receiver._lock:
                        receiver.spans.extend(spans)
                        receiver.headers.append(dict(self.headers))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if spans is not None else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def env(self, service: str = "motley-test") -> dict[str, str]:
        return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
                "OTEL_EXPORTER_OTLP_HEADERS": "x-test-tenant=motley", "OTEL_SERVICE_NAME": service,
                "OTEL_BSP_SCHEDULE_DELAY": "50"}

    def wait(self, found: Callable[[list[ReceivedSpan]], bool],
             timeout_s: float = 20.0) -> list[ReceivedSpan]:
        """Every span received once ``found(spans)`` holds; AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"no such spans within {timeout_s} s; got {[s.name for s in spans]}")
            time.sleep(0.05)
