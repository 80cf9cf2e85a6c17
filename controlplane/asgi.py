"""ASGI entry point: HTTP through Django, websockets through Channels.

Two kinds of websocket clients: agents, authenticated by the node credential in a header (a web
page cannot set one, and agents send no Origin), and browsers, authenticated by their session and
held to the site's allowed hosts so another site's page cannot open a socket in a user's name.

The gateway's event loop shares this process with Django's sync views, which run in threads and
may compute for a while (the planner behind a plan request, a drain's re-plans, a what-if). Under
CPython's default 5 ms GIL switch interval the loop waits up to 5 ms for the GIL at each wake-up
while such a thread computes, and a streamed token takes several wake-ups; at 1 ms it gets the GIL
back within a millisecond (benchmarks/switch_interval_bench.py: a socket round trip on the loop
with a thread computing, 5.0 ms at 5 ms against 0.9 ms at 1 ms).

The process traces its requests where the ``OTEL_*`` variables ask (contracts/tracing.py), into its
own trace store too when they name ``motley`` (the dashboard's request timeline): the gateway's own
spans, and Django's and Celery's instrumentation (controlplane/gateway/traces/instrumentation.py),
set up before Django's handler loads the middleware the Django one adds.

The garbage collector is tuned for a server that allocates fast and keeps a large, stable state.
Once the application is built, the objects made so far (Django's apps, URL patterns, models: about
125,000) are frozen out of its reach (``gc.freeze``): they live as long as the process, and every
full collection walked them. And the youngest generation is collected every 10,000 tracked
allocations, not 700: at 10,000 GPUs' telemetry (20,000 allocations a second) a heartbeat's objects,
which live for a keeper interval or a tick, outlived a collection every 30 ms and went on to the
older generations, whose collections then took a fifth of the server's CPU and paused its event
loop for up to 0.3 s; at 10,000 they die young and the collector takes about 7 % (a gen-0 pass
costs in proportion to the objects it finds, so passing less often costs no more).
"""

import gc
import os
import sys

import django
from django.core.asgi import get_asgi_application

GIL_SWITCH_INTERVAL_S = 0.001
GC_THRESHOLDS = (10_000, 10, 100)  # allocations before a gen-0 pass; gen-0 passes per gen-1; gen-1 per gen-2
sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
gc.set_threshold(*GC_THRESHOLDS)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django.setup(set_prefix=False)

# Imported after Django is set up: consumers (and the trace store) import models.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from controlplane.dashboard.consumers import DashboardConsumer  # noqa: E402
from controlplane.enrollment.consumers import AgentConsumer  # noqa: E402
from controlplane.gateway.traces.instrumentation import control_plane_tracing  # noqa: E402
from controlplane.not_found import NoSuchSocket  # noqa: E402
from controlplane.process_services import WithProcessServices, lifespan  # noqa: E402

control_plane_tracing("gateway", django=True)
django_asgi_app = get_asgi_application()


def browser(consumer):
    """A route for browsers: session user in scope, and an Origin of this site required."""
    return AllowedHostsOriginValidator(AuthMiddlewareStack(consumer))


# Static files (the dashboard's CSS, JS and plotly.js) are served by the app itself, so the embedded
# default needs no web server in front. This process's services (the telemetry hub, keeper and
# heartbeat flusher, the usage writer, the gateway's serving state) start before the first connection
# is served, an agent's, a browser's or a client's (controlplane/process_services.py).
application = ProtocolTypeRouter({
    "http": WithProcessServices(ASGIStaticFilesHandler(django_asgi_app)),
    "websocket": WithProcessServices(URLRouter([
        path("ws/agents/", AgentConsumer.as_asgi()),
        path("ws/dashboard/", browser(DashboardConsumer.as_asgi())),
        re_path(r"", NoSuchSocket.as_asgi()),  # any other path: refused, not a 500
    ])),
    "lifespan": lifespan,
})
gc.freeze()
