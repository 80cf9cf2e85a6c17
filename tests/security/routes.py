"""Every HTTP route of the URL conf and every websocket route of the ASGI application, found by walking
them (not listed by hand), so a route added later is in the authorization matrix or fails it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from channels.routing import URLRouter
from django.urls import URLPattern, URLResolver, get_resolver

UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
# A view function states its methods only inside its decorators: each is tried with GET and POST.
FUNCTION_VIEW_METHODS = ("GET", "POST")


@dataclass(frozen=True)
class Route:
    template: str  # "/api/v1/nodes/{pk}/": the route with its parameters named
    path: str  # a concrete path: ids that match no row, so an allowed change is refused as not found
    methods: tuple[str, ...]


def _template(route: str) -> str:
    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", r"{\1}", route)
    route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
    return "/" + route.replace("^", "").replace("$", "")


def _methods(pattern: URLPattern) -> tuple[str, ...]:
    callback = pattern.callback
    if actions := getattr(callback, "actions", None):  # a DRF viewset's route (HEAD: its GET, which
        return tuple(sorted(m.upper() for m in actions if m != "head"))  # DRF adds on the first request)
    view_class = getattr(callback, "view_class", None) or getattr(callback, "cls", None)
    if view_class is None:
        return FUNCTION_VIEW_METHODS
    return tuple(m.upper() for m in ("get", "post", "put", "patch", "delete") if hasattr(view_class, m))


def _walk(patterns, prefix: str = "",
          namespace: str | None = None) -> Iterator[tuple[str, URLPattern, str | None]]:
    for entry in patterns:
        if isinstance(entry, URLResolver):
            yield from _walk(entry.url_patterns, prefix + str(entry.pattern), entry.namespace or namespace)
        else:
            yield prefix + str(entry.pattern), entry, namespace


def http_routes() -> list[Route]:
    """Each route once: a format-suffix twin (``nodes.json``) is its route's view again, and the admin
    site is its index (every admin page is wrapped by the same ``AdminSite.admin_view`` staff check)."""
    routes: dict[str, Route] = {}
    for route, pattern, namespace in _walk(get_resolver().url_patterns):
        if "(?P<format>" in route or (namespace == "admin" and route != "admin/"):
            continue
        template = _template(route)
        path = template.replace("{pk}", "999999").replace("{name}", "nope").replace("{trace_id}", "0" * 32)
        assert "{" not in path, f"{template}: give its parameter a value in tests/security/routes.py"
        routes[template] = Route(template, path, _methods(pattern))
    return sorted(routes.values(), key=lambda r: r.template)


def websocket_routes(application) -> list[str]:
    """The paths of the ASGI application's websocket routes (inside its middleware)."""
    app = application.application_mapping["websocket"]
    while not isinstance(app, URLRouter):
        app = getattr(app, "app", None) or getattr(app, "inner")
    return sorted("/" + str(route.pattern) for route in app.routes)
