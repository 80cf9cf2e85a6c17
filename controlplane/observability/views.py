"""``GET /metrics``: the Prometheus exposition, for a scraper that presents the token or calls from an
allowed address.

- ``Authorization: Bearer <MOTLEY_METRICS_TOKEN>`` is accepted from anywhere (when a token is set);
  any other ``Authorization`` header is refused with ``401``, whatever the address.
- Without one, the client's address (``client_address``: behind a balancer listed in
  ``MOTLEY_TRUSTED_PROXIES``, the client's from its ``X-Forwarded-For``) must be in
  ``MOTLEY_METRICS_ALLOW`` (networks; default loopback only): else ``401`` where a token would be
  accepted, ``403`` where none is set.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_safe

from controlplane.common.client_address import address_allowed, client_address
from controlplane.observability.exposition import metrics_render


def _refused(status: int, message: str) -> HttpResponse:
    response = HttpResponse(message + "\n", status=status, content_type="text/plain; charset=utf-8")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="motley metrics"'
    return response


def _access(request: HttpRequest) -> HttpResponse | None:
    """None when the request may read the metrics, else the refusal."""
    token = settings.MOTLEY_METRICS_TOKEN
    header = request.headers.get("Authorization")
    if header is not None:
        scheme, _, presented = header.partition(" ")
        presented = presented.strip().encode()
        if token and scheme.lower() == "bearer" and hmac.compare_digest(presented, token.encode()):
            return None
        return _refused(401, "metrics: the token is wrong (Authorization: Bearer <MOTLEY_METRICS_TOKEN>)")
    if address_allowed(client_address(request) or "", settings.MOTLEY_METRICS_ALLOW,
                       setting="MOTLEY_METRICS_ALLOW"):
        return None
    if token:
        return _refused(401, "metrics: a token is needed (Authorization: Bearer <MOTLEY_METRICS_TOKEN>)")
    return _refused(403, "metrics: this address is not in MOTLEY_METRICS_ALLOW, and no MOTLEY_METRICS_TOKEN "
                         "is set")


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    if (refused := _access(request)) is not None:
        return refused
    body, content_type = metrics_render(accept=request.headers.get("Accept", ""))
    return HttpResponse(body, content_type=content_type)
