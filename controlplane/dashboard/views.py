"""Dashboard pages: thin views over selectors; each page embeds its first paint as JSON.

The JS modules (frontend/static/dashboard/) redraw from the same JSON, from ``/ws/dashboard/``
snapshots, and from the REST API when the socket reconnects.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from contracts.tracing import tracing_exporters
from controlplane.dashboard import selectors
from controlplane.deployments.models import Deployment
from controlplane.deployments.targets import MAX_WINDOW_S, MIN_WINDOW_S, PERCENTILES
from controlplane.gateway.traces.selectors import trace_list
from controlplane.telemetry.rollups import rollup_series
from controlplane.telemetry.runtime import current_hub
from controlplane.telemetry.schema import FIELDS

LIVE_WINDOW_S = 300
STORED_WINDOW_S = 3600
EVENTS_SHOWN = 20  # per deployment, and of the fleet, on the deployments page


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return redirect("dashboard:topology")


@login_required
def topology(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/topology.html", {"page": "topology", "topology": selectors.topology()})


@login_required
def utilization(request: HttpRequest) -> HttpResponse:
    context = {"page": "utilization", "topology": selectors.topology()}
    return render(request, "dashboard/utilization.html", context)


@login_required
def fleet(request: HttpRequest) -> HttpResponse:
    """The fleet overview: a heat map of every card and the cards in each state (fleet.js)."""
    topology = selectors.topology()
    gpus = sum(len(node["devices"]) for node in topology["nodes"])
    return render(request, "dashboard/fleet.html", {"page": "fleet", "topology": topology, "gpus": gpus})


@login_required
def nodes(request: HttpRequest) -> HttpResponse:
    context = {"page": "nodes", "nodes": selectors.node_list(), "devices": selectors.device_list()}
    return render(request, "dashboard/nodes.html", context)


@login_required
def models(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/models.html", {"page": "models", "models": selectors.model_list()})


@login_required
@require_GET
def telemetry_series(request: HttpRequest) -> HttpResponse:
    """Series per device or stage: the last 5 minutes from memory, or the last hour from rollups.

    ``?kind=device|stage&window=300|3600&key=<name>&key=…`` (no key: all). The page calls it on load
    and whenever its socket reconnects, so a gap in the live stream never stays on screen.
    """
    kind = request.GET.get("kind", "device")
    if kind not in FIELDS:
        return HttpResponseBadRequest("kind: device or stage")
    try:
        window = int(request.GET.get("window", LIVE_WINDOW_S))
    except ValueError:
        return HttpResponseBadRequest("window: seconds")
    keys = request.GET.getlist("key") or None
    if window <= settings.MOTLEY_TELEMETRY_HISTORY_S:
        hub = current_hub()
        series = hub.recent(kind, keys, window) if hub else {}
        source = "memory"
    else:
        series, source = rollup_series(kind=kind, keys=keys, window_s=window), "rollups"
    return JsonResponse({"kind": kind, "window": window, "source": source, "fields": FIELDS[kind],
                         "series": series})


@login_required
@require_GET
def topology_json(request: HttpRequest) -> HttpResponse:
    """The topology page's data, refetched when its socket reconnects."""
    return JsonResponse(selectors.topology())


@login_required
def deployments(request: HttpRequest) -> HttpResponse:
    context = {"page": "deployments",
               "deployments": selectors.deployment_overview(events=EVENTS_SHOWN, calibration=True),
               "fleet_events": selectors.fleet_events(limit=EVENTS_SHOWN), "events_shown": EVENTS_SHOWN}
    return render(request, "dashboard/deployments.html", context)


@login_required
def plan_editor(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        editor = selectors.deployment_editor(deployment_id=pk)
    except Deployment.DoesNotExist:
        raise Http404("no such deployment") from None
    limits = {"percentiles": PERCENTILES, "min_window_s": MIN_WINDOW_S, "max_window_s": MAX_WINDOW_S}
    return render(request, "dashboard/plan_editor.html",
                  {"page": "deployments", "editor": editor, "target_limits": limits})


@login_required
@require_GET
def traces(request: HttpRequest) -> HttpResponse:
    """Recent sampled requests and one's waterfall (traces.js), from the control plane's trace store;
    ``?trace=<id>`` opens that trace."""
    context = {"page": "deployments", "traces": trace_list(), "selected": request.GET.get("trace", ""),
               "keeping": "motley" in tracing_exporters(), "kept": settings.MOTLEY_TRACE_SPANS_KEPT}
    return render(request, "dashboard/traces.html", context)
