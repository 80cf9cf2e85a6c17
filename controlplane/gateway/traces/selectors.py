"""Reads of the kept traces: the recent ones, and one trace's spans as a tree for its waterfall."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min

from controlplane.gateway.traces.models import TraceSpan

LIST_LIMIT = 50


def tracing_ui_url(trace_id: str) -> str | None:
    """The trace in the operator's own tracing UI (``MOTLEY_TRACING_UI_URL``), None without one."""
    template = settings.MOTLEY_TRACING_UI_URL
    return template.replace("{trace_id}", trace_id) if template else None


def trace_list(*, limit: int = LIST_LIMIT) -> list[dict[str, Any]]:
    """The most recent traces, newest first: each one's first span (its root in motley: the gateway's
    request) and its outcome, the model, when it started, how long it lasted, its span count and
    whether a span failed."""
    rows = list(TraceSpan.objects.values("trace_id").annotate(
        start_ns=Min("start_ns"), end_ns=Max("end_ns"), spans=Count("id"), worst=Max("status_code"),
    ).order_by("-start_ns")[:limit])
    firsts: dict[str, TraceSpan] = {}
    models: dict[str, str] = {}  # the model a span names (the gateway's admission does)
    for span in TraceSpan.objects.filter(trace_id__in=[r["trace_id"] for r in rows]).order_by("start_ns"):
        firsts.setdefault(span.trace_id, span)
        if "motley.model" in span.attributes:
            models.setdefault(span.trace_id, span.attributes["motley.model"])
    traces = []
    for row in rows:
        first = firsts[row["trace_id"]]
        traces.append({
            "trace_id": row["trace_id"], "name": first.name, "start_ns": row["start_ns"],
            "duration_s": (row["end_ns"] - row["start_ns"]) / 1e9, "spans": row["spans"],
            "error": row["worst"] == 2, "outcome": first.attributes.get("motley.outcome"),
            "model": models.get(row["trace_id"]), "tracing_ui_url": tracing_ui_url(row["trace_id"]),
        })
    return traces


def trace_detail(*, trace_id: str) -> dict[str, Any] | None:
    """One trace's spans, each after its parent (depth-first, siblings by start), with ``depth`` and
    ``offset_s`` / ``duration_s`` from the trace's start; None when none of its spans is kept. A span
    whose parent is not kept (the client's, or one trimmed away) is shown as a root."""
    spans = list(TraceSpan.objects.filter(trace_id=trace_id).order_by("start_ns", "id"))
    if not spans:
        return None
    start = min(span.start_ns for span in spans)
    ids = {span.span_id for span in spans}
    children: dict[str, list[TraceSpan]] = {}
    for span in spans:
        children.setdefault(span.parent_span_id if span.parent_span_id in ids else "", []).append(span)
    ordered: list[dict[str, Any]] = []
    seen: set[str] = set()  # a span named as its own ancestor (a malformed export) is shown once

    def visit(parent: str, depth: int) -> None:
        for span in children.get(parent, ()):
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            ordered.append({
                "span_id": span.span_id, "parent_span_id": span.parent_span_id, "name": span.name,
                "depth": depth, "offset_s": (span.start_ns - start) / 1e9,
                "duration_s": (span.end_ns - span.start_ns) / 1e9, "status_code": span.status_code,
                "status_message": span.status_message, "attributes": span.attributes,
                "resource": span.resource,
                "events": [{**event, "offset_s": (event["time_ns"] - start) / 1e9} for event in span.events],
            })
            visit(span.span_id, depth + 1)

    visit("", 0)
    return {"trace_id": trace_id, "start_ns": start, "tracing_ui_url": tracing_ui_url(trace_id),
            "spans": ordered}
