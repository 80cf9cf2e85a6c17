"""OpenTelemetry tracing of one process (gateway, control-plane worker, stage, agent): off unless the
standard ``OTEL_*`` variables ask for it, exported over OTLP/HTTP (docs/observability.md, "Traces").

Every process that traces calls :func:`tracing_setup` once with what names it (its role and, for a
stage, node, device and stage), and takes its tracer from :func:`tracer`: ``None`` while tracing is
off, so a caller skips all span work with one test and tracing off costs nothing. The SDK reads the
rest of the standard variables itself: ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``_TRACES_ENDPOINT``,
``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_TRACES_SAMPLER`` / ``_ARG``, ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES`` and the batch processor's ``OTEL_BSP_*``. The trace context crosses a
process boundary as a W3C ``traceparent`` string (the gateway's response, the head's ``submit``
frame: docs/contracts.md §2), made and read here so both sides agree on it.

Where spans go (``OTEL_TRACES_EXPORTER``, a list): ``otlp`` to the operator's collector
(``OTEL_EXPORTER_OTLP_*``); ``motley`` to the control plane, which keeps the recent ones for the
dashboard's request timeline: the control plane hands :func:`tracing_setup` its own store, a stage
posts OTLP/HTTP to ``<MOTLEY_TRACE_SINK>/api/v1/traces/otlp/`` (the agent sets the variable to its
control plane's URL) signed as its pipeline (:func:`sink_authorization`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from contracts.env import env_bool, env_str

if TYPE_CHECKING:  # the SDK is imported only once tracing is on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

_PROPAGATOR = TraceContextTextMapPropagator()
TRACE_SINK_ENV = "MOTLEY_TRACE_SINK"  # the control plane's URL, where a stage sends its spans for it to keep
SINK_PATH = "/api/v1/traces/otlp/"
_SINK_SCHEME = "Pipeline"
_EXPORTERS = ("otlp", "motley")
_provider: Any = None  # the SDK's TracerProvider of this process, once set up with tracing on


def tracing_exporters() -> set[str]:
    """What ``OTEL_TRACES_EXPORTER`` names of ``otlp`` and ``motley`` (none: tracing off; the SDK's own
    default is ``otlp``, motley's is ``none``); nothing while ``OTEL_SDK_DISABLED`` is true."""
    if env_bool("OTEL_SDK_DISABLED", False):
        return set()
    named = {e.strip() for e in env_str("OTEL_TRACES_EXPORTER", "none").lower().split(",")}
    return named & set(_EXPORTERS)


def tracing_enabled() -> bool:
    return bool(tracing_exporters())


def tracing_setup(role: str, *, store: SpanExporter | None = None, pipeline: tuple[str, str] | None = None,
                  sampler: Callable[[Sampler], Sampler] | None = None,
                  **attributes: str | int | None) -> bool:
    """Start exporting this process's spans if tracing is on; says whether it is. ``role``: gateway,
    worker, stage or agent (``motley.role``); ``attributes``: ``motley.<name>`` resource attributes
    (node, device, stage), None ones left out; ``sampler`` wraps the sampler the ``OTEL_TRACES_SAMPLER``
    variables choose (the control plane's leaves out traces no request began). With ``motley``
    exported: the control plane passes ``store``, its own keeper of spans; a stage passes ``pipeline``
    (its id and token), which signs what it sends to ``MOTLEY_TRACE_SINK``; a process none of whose
    spans would go anywhere (an agent with only ``motley``) does not trace. Called again (a stage given
    a new spec in place, a forked stage) it flushes the last provider and starts another with the new
    attributes."""
    global _provider
    exporters = tracing_exporters()
    if not exporters:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracing_shutdown()
    sink = env_str(TRACE_SINK_ENV, "").rstrip("/")
    if "motley" in exporters and store is None and pipeline is not None and sink:
        store = OTLPSpanExporter(endpoint=sink + SINK_PATH,
                                 headers={"Authorization": sink_authorization(*pipeline)})
    targets = [OTLPSpanExporter()] if "otlp" in exporters else []
    targets += [store] if "motley" in exporters and store is not None else []
    if not targets:  # motley alone where spans have no way to the control plane (an agent): off
        return False
    named = {f"motley.{key}": value for key, value in attributes.items() if value is not None}
    resource = Resource.create({"service.name": env_str("OTEL_SERVICE_NAME", "motley"),
                                "motley.role": role, **named})
    provider = TracerProvider(resource=resource)  # its sampler from OTEL_TRACES_SAMPLER / _ARG
    if sampler is not None:  # before any tracer takes the provider's sampler
        provider.sampler = sampler(provider.sampler)
    for target in targets:
        provider.add_span_processor(BatchSpanProcessor(target))
    _provider = provider
    return True


def sink_authorization(pipeline_id: str, auth_token: str) -> str:
    """The ``Authorization`` a stage's spans reach the control plane with: its pipeline's token, which
    the control plane gave the pipeline and checks against the replicas it serves."""
    return f"{_SINK_SCHEME} {pipeline_id}:{auth_token}"


def sink_credentials(authorization: str) -> tuple[str, str] | None:
    """The pipeline id and token of a :func:`sink_authorization` header; None for anything else."""
    scheme, _, value = authorization.strip().partition(" ")
    pipeline_id, _, token = value.strip().partition(":")
    return (pipeline_id, token) if scheme == _SINK_SCHEME and pipeline_id and token else None


def tracing_shutdown() -> None:
    """Export what is buffered and stop (a stage process leaves by ``os._exit``, past ``atexit``)."""
    global _provider
    if _provider is not None:
        _provider.shutdown()
        _provider = None


def django_excluded_urls(own: tuple[str, ...]) -> str:
    """``own`` regular expressions and the operator's ``OTEL_PYTHON_DJANGO_EXCLUDED_URLS``, in that
    variable's comma-separated form: URLs the Django instrumentation makes no span for."""
    return ",".join(filter(None, (*own, env_str("OTEL_PYTHON_DJANGO_EXCLUDED_URLS", ""))))


def tracer_provider() -> TracerProvider | None:
    """This process's provider, for an instrumentation library to trace with; None while tracing is off."""
    return _provider


def tracer(name: str) -> Tracer | None:
    """The tracer of module ``name``; None while tracing is off in this process."""
    return _provider.get_tracer(name) if _provider is not None else None


def parent_context(traceparent: str | None) -> Context | None:
    """The remote parent a W3C ``traceparent`` names; None for none or one that does not parse (the
    W3C rule: an invalid one is ignored, never an error)."""
    if not isinstance(traceparent, str) or not traceparent:
        return None
    context = _PROPAGATOR.extract({"traceparent": traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def traceparent_of(span: Span) -> str | None:
    """The ``traceparent`` that makes ``span`` the parent of the next process's spans (None when it
    is not sampled: the next process records nothing for it)."""
    context = span.get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, trace.set_span_in_context(span))
    return carrier.get("traceparent")


def trace_id_hex(span: Span) -> str:
    """The span's trace id as the 32 hex digits tracing UIs search by."""
    return trace.format_trace_id(span.get_span_context().trace_id)
