"""Spans of recent sampled requests, kept for the request timeline; bounded in number and in age
(``MOTLEY_TRACE_SPANS_KEPT``, ``MOTLEY_TRACE_MAX_AGE_S``: ``traces.store``)."""

from __future__ import annotations

from django.db import models


class TraceSpan(models.Model):
    """One finished span as OTLP describes it, from the gateway's own tracer or a stage's export.

    Times are Unix nanoseconds as the span carries them (each process's wall clock); ``received_at``
    (the control plane's clock) is what the age limit and the cap go by.
    """

    trace_id = models.CharField(max_length=32, db_index=True)
    span_id = models.CharField(max_length=16)
    parent_span_id = models.CharField(max_length=16, blank=True, help_text="Empty for a root span.")
    name = models.CharField(max_length=200)
    start_ns = models.BigIntegerField()
    end_ns = models.BigIntegerField()
    status_code = models.PositiveSmallIntegerField(default=0, help_text="0 unset, 1 ok, 2 error.")
    status_message = models.CharField(max_length=200, blank=True)
    attributes = models.JSONField(default=dict)
    events = models.JSONField(default=list, help_text='[{"name", "time_ns", "attributes"}]')
    resource = models.JSONField(default=dict, help_text="The process: motley.role, .node, .stage, …")
    received_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["trace_id", "start_ns"]
        constraints = [
            # An exporter retries a batch it could not confirm: the second copy is dropped.
            models.UniqueConstraint(fields=["trace_id", "span_id"], name="trace_span_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.trace_id}/{self.span_id}"
