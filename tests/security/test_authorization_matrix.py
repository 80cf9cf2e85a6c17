"""The authorization matrix: every HTTP route (walked from the URL conf) and websocket route (walked
from controlplane/asgi.py), every method it serves, every kind of caller, and the answer expected.

A route or method that is not in ``EXPECTED`` fails the test by name, so a new route is decided here
when it is added. Requests are safe: reads, and changes aimed at ids that match no row (an allowed
caller gets 404 or 400 from the view itself, a refused one 401 or 403 before the view runs).

Answers: ``ok`` (authorization passed: the view answered, 2xx or its own 400/404), ``401``, ``403``,
``405`` (the method is not served, whoever asks), ``login`` (a redirect to the login page), ``503``
(the view answered that it cannot serve: ``/health`` with nothing deployed).
"""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from controlplane.asgi import application
from tests.security.principals import NAMES, principals_create
from tests.security.routes import UNSAFE, http_routes, websocket_routes


def row(anonymous, plain, operator, admin, api_key, node, other_node=None, revoked_node=None) -> dict:
    """One route's answers by principal; the two wrong node credentials answer as an anonymous caller."""
    values = (anonymous, plain, operator, admin, api_key, node, other_node or anonymous,
              revoked_node or anonymous)
    return dict(zip(NAMES, values, strict=True))


API_READ = row("401", "ok", "ok", "ok", "401", "401")  # any signed-in user reads
API_CHANGE = row("401", "403", "ok", "ok", "401", "401")  # operators and staff change
# Staff alone: the audit trail names users, their API keys and their addresses.
STAFF_READ = row("401", "403", "403", "ok", "401", "401")
WHAT_IF = API_READ  # computed, not stored: what-if planning
PAGE = row("login", "ok", "ok", "ok", "login", "login")  # the dashboard's pages need a session
NOT_SERVED = row("405", "405", "405", "405", "405", "405")
GATEWAY = row("401", "401", "401", "401", "ok", "401")  # OpenAI clients: an API key, nothing else
# /health: anyone, credentials or not (probes hold none); nothing is deployed here, hence its 503.
HEALTH = row("503", "503", "503", "503", "503", "503", "503", "503")
LOGIN_FORM = row("ok", "ok", "ok", "ok", "ok", "ok")
# /metrics from loopback (MOTLEY_METRICS_ALLOW's default): open without credentials; any
# Authorization header that is not the metrics token is refused.
METRICS = row("ok", "ok", "ok", "ok", "401", "401", "401", "401")
ADMIN = row("login", "login", "login", "ok", "login", "login")
# The join token in the body is the credential; a bogus one is refused whoever sends it.
REGISTER = row("403", "403", "403", "403", "403", "403", "403", "403")
# A stage's spans: its pipeline's token alone (tests/gateway/test_trace_store.py), no one else's credential.
PIPELINE_ONLY = row("401", "401", "401", "401", "401", "401", "401", "401")

# A page answers a POST as a GET (it changes nothing): the session is what matters.
PAGE_ROUTES = ("/", "/deployments/", "/deployments/{pk}/plan/", "/fleet/", "/models/", "/nodes/",
               "/topology/", "/usage/", "/utilization/")
PAGE_GET_ONLY = row("login", "405", "405", "405", "login", "login")  # login first, then the method
STAFF_PAGE = row("login", "403", "403", "ok", "login", "login")  # the Audit page, as its API
API_READS = ("/api/docs/try/", "/api/schema/", "/api/v1/api-keys/", "/api/v1/deployments/{pk}/demand/",
             "/api/v1/deployments/{pk}/proposals/",
             "/api/v1/deployments/{pk}/revisions/", "/api/v1/events/", "/api/v1/events/{pk}/",
             "/api/v1/gpu-models/", "/api/v1/gpu-models/{name}/", "/api/v1/models/{pk}/profile/",
             "/api/v1/models/{pk}/quality/", "/api/v1/plans/calibration/", "/api/v1/telemetry/",
             "/api/v1/traces/", "/api/v1/traces/{trace_id}/", "/api/v1/usage/")
# Inventory and deployments: everyone signed in reads, operators change (create, edit, delete, actions).
API_RESOURCES = {
    "/api/v1/deployments/": ("POST",), "/api/v1/deployments/{pk}/": ("PATCH",),
    "/api/v1/devices/": ("POST",), "/api/v1/devices/{pk}/": ("DELETE", "PATCH", "PUT"),
    "/api/v1/links/": ("POST",), "/api/v1/links/{pk}/": ("DELETE", "PATCH", "PUT"),
    "/api/v1/models/": ("POST",), "/api/v1/models/{pk}/": ("DELETE",),
    "/api/v1/nodes/": ("POST",), "/api/v1/nodes/{pk}/": ("DELETE", "PATCH", "PUT"),
}
PLACEMENT_ACTIONS = ("/api/v1/deployments/{pk}/apply/", "/api/v1/deployments/{pk}/stop/",
                     "/api/v1/devices/{pk}/emulate-throttle/", "/api/v1/nodes/{pk}/cordon/",
                     "/api/v1/nodes/{pk}/drain/", "/api/v1/nodes/{pk}/uncordon/",
                     "/api/v1/nodes/{pk}/undrain/",
                     "/api/v1/rebalance-proposals/{pk}/accept/", "/api/v1/rebalance-proposals/{pk}/dismiss/")

EXPECTED: dict[str, dict[str, dict]] = {
    **{route: {"GET": PAGE, "POST": PAGE} for route in PAGE_ROUTES},
    **{route: {"GET": PAGE, "POST": PAGE_GET_ONLY}
       for route in ("/dashboard/telemetry/", "/dashboard/topology.json", "/deployments/traces/")},
    "/audit/": {"GET": STAFF_PAGE, "POST": PAGE_GET_ONLY},
    "/accounts/login/": {"GET": LOGIN_FORM, "POST": LOGIN_FORM, "PUT": LOGIN_FORM},
    "/accounts/logout/": {"GET": NOT_SERVED, "POST": LOGIN_FORM},
    "/admin/": {"GET": ADMIN, "POST": ADMIN},
    "/api/docs/": {"GET": PAGE},
    **{route: {"GET": API_READ} for route in API_READS},
    **{route: {"GET": STAFF_READ} for route in ("/api/v1/audit/", "/api/v1/audit/{pk}/")},
    **{route: {"GET": API_READ, **{m: API_CHANGE for m in changes}}
       for route, changes in API_RESOURCES.items()},
    **{route: {"POST": API_CHANGE} for route in PLACEMENT_ACTIONS},
    # Staff change a key's limits (an operator who is not staff is refused by the view: 404 here, no key).
    "/api/v1/api-keys/{pk}/": {"GET": API_READ, "PATCH": API_CHANGE,
                               "PUT": row("401", "403", "405", "405", "401", "401")},
    "/api/v1/agents/register/": {"POST": REGISTER},
    "/api/v1/traces/otlp/": {"GET": NOT_SERVED, "POST": PIPELINE_ONLY},
    "/api/v1/gateway/router/": {"GET": API_READ, "POST": NOT_SERVED},
    "/api/v1/plans/": {"POST": WHAT_IF},  # storing the plan ("save": true) is an operator's: tested below
    "/api/v1/plans/validate/": {"POST": WHAT_IF},
    "/metrics": {"GET": METRICS, "POST": NOT_SERVED},
    "/v1/models": {"GET": GATEWAY, "POST": NOT_SERVED},
    "/v1/completions": {"GET": NOT_SERVED, "POST": GATEWAY},
    "/v1/chat/completions": {"GET": NOT_SERVED, "POST": GATEWAY},
    "/health": {"GET": HEALTH, "POST": NOT_SERVED},
    "/tokenize": {"GET": NOT_SERVED, "POST": GATEWAY},
    "/detokenize": {"GET": NOT_SERVED, "POST": GATEWAY},
}


def outcome(response) -> str:
    if response.status_code in (301, 302) and "login" in response.get("Location", ""):
        return "login"
    if response.status_code in (401, 403, 405, 503):
        return str(response.status_code)
    assert response.status_code < 500, response.content[:500]
    return "ok"


def _request(client, method: str, path: str):
    body = {"join_token": "mj-bogus", "name": "x", "address": "127.0.0.1", "emulated": True, "devices": []} \
        if path == "/api/v1/agents/register/" else {}
    if method in UNSAFE:
        return getattr(client, method.lower())(path, data=body, content_type="application/json")
    return client.get(path)


@pytest.mark.django_db
def test_every_http_route_answers_each_caller_as_the_table_says():
    principals = principals_create()
    routes = http_routes()
    missing = [f"{m} {r.template}" for r in routes for m in r.methods
               if m not in EXPECTED.get(r.template, {})]
    stale = [f"{m} {t}" for t, by in EXPECTED.items() for m in by
             if not any(r.template == t and m in r.methods for r in routes)]
    assert not missing, f"routes missing from the authorization matrix (decide who may call them): {missing}"
    assert not stale, f"the matrix names routes that no longer exist: {stale}"
    wrong = []
    for route in routes:
        for method in route.methods:
            for name, principal in principals.items():
                got = outcome(_request(principal.client(), method, route.path))
                if got != EXPECTED[route.template][method][name]:
                    wrong.append(f"{method} {route.template} as {name}: {got}, "
                                 f"expected {EXPECTED[route.template][method][name]}")
    assert not wrong, "\n".join(wrong)


# Websockets: "accept" or "refuse" (closed before accepting). The agents' route takes a node's current
# credential and nothing else, whatever the Origin (an agent sends none; a page cannot set the header);
# the browsers' route takes a session, and only from a page of this site.
AGENTS_SOCKET = row("refuse", "refuse", "refuse", "refuse", "refuse", "accept")
BROWSER_SOCKET = row("refuse", "accept", "accept", "accept", "refuse", "refuse")
OWN_ORIGIN, FOREIGN_ORIGIN = "http://127.0.0.1:8000", "http://evil.example"
WEBSOCKETS = {
    "/ws/agents/": {OWN_ORIGIN: AGENTS_SOCKET, FOREIGN_ORIGIN: AGENTS_SOCKET},
    "/ws/dashboard/": {OWN_ORIGIN: BROWSER_SOCKET, FOREIGN_ORIGIN: row(*["refuse"] * 6)},
    "/": {OWN_ORIGIN: row(*["refuse"] * 6), FOREIGN_ORIGIN: row(*["refuse"] * 6)},  # every other path
}


@pytest.mark.django_db(transaction=True)
async def test_every_websocket_route_accepts_each_caller_and_origin_as_the_table_says():
    routes = websocket_routes(application)
    assert sorted(WEBSOCKETS) == routes, f"websocket routes unlisted: {set(routes) - set(WEBSOCKETS)}"
    principals = await database_sync_to_async(principals_create)()
    wrong = []
    for route, by_origin in WEBSOCKETS.items():
        for origin, expected in by_origin.items():
            for name, principal in principals.items():
                headers = await database_sync_to_async(principal.websocket_headers)(origin)
                communicator = WebsocketCommunicator(application, route, headers=headers)
                connected, _ = await communicator.connect()
                await communicator.disconnect()
                if ("accept" if connected else "refuse") != expected[name]:
                    wrong.append(f"{route} from {origin} as {name}: expected {expected[name]}")
    assert not wrong, "\n".join(wrong)
