"""Keeping spans: ``trace_spans_store`` writes a batch and trims the table to its bounds;
``StoreExporter`` is the control plane's own span exporter into it (``OTEL_TRACES_EXPORTER`` naming
``motley``: contracts/tracing.py).

The table is bounded twice: spans older than ``MOTLEY_TRACE_MAX_AGE_S`` go, and past
``MOTLEY_TRACE_SPANS_KEPT`` spans the oldest go, whatever trace they belong to (a trace cut that way
loses its oldest spans first). Trimming runs with each batch, so the bound holds between batches too
without a task of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, close_old_connections, connection
from django.utils import timezone
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from controlplane.gateway.traces.models import TraceSpan
from controlplane.gateway.traces.otlp import message_spans

log = logging.getLogger(__name__)


def trace_spans_store(*, spans: list[dict[str, Any]]) -> int:
    """Keep ``spans`` (``TraceSpan`` fields; one already kept is skipped) and trim the table to its
    bounds; says how many came. Nothing is kept when ``MOTLEY_TRACE_SPANS_KEPT`` is 0."""
    kept = settings.MOTLEY_TRACE_SPANS_KEPT
    if kept <= 0 or not spans:
        return len(spans)
    now = timezone.now()
    TraceSpan.objects.bulk_create([TraceSpan(**span, received_at=now) for span in spans],
                                  ignore_conflicts=True)
    too_old = now - timedelta(seconds=settings.MOTLEY_TRACE_MAX_AGE_S)
    TraceSpan.objects.filter(received_at__lt=too_old).delete()
    beyond = TraceSpan.objects.order_by("-id").values_list("id", flat=True)[kept:kept + 1]
    if beyond:
        TraceSpan.objects.filter(id__lte=beyond[0]).delete()
    return len(spans)


class StoreExporter(SpanExporter):
    """The gateway's spans into the store, from the batch processor's thread: encoded as OTLP and read
    back as a stage's export is, so both kinds of span are kept alike."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not connection.in_atomic_block:  # a caller's transaction (a flush from its thread) is its own
            close_old_connections()  # the batch thread's connection may have gone with a database restart
        try:
            trace_spans_store(spans=message_spans(encode_spans(spans)))
        except DatabaseError as exc:
            log.warning("%d spans not kept: %s", len(spans), exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass
