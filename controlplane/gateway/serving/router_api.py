"""``GET /api/v1/gateway/router/``: what the router uses and what it decided, for operators.

An async view (the router lives on the server's event loop, like the OpenAI endpoints), authenticated
as the rest of the API: a DRF token (``Authorization: Token …``) or the dashboard's session.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from rest_framework.authtoken.models import Token

from controlplane.gateway.serving.runtime import gateway_stats


async def _api_user(request: HttpRequest) -> AbstractBaseUser | None:
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "token" and key.strip():
        token = await Token.objects.select_related("user").filter(key=key.strip()).afirst()
        return token.user if token is not None and token.user.is_active else None
    user = await request.auser()
    return user if user.is_authenticated else None


@require_GET
async def router_view(request: HttpRequest) -> HttpResponse:
    """Per served model and replica, the router's inputs now (health and why, costs and their
    source, telemetry and head statistics with their ages, its bookkeeping), and its recent
    decisions, each with the inputs it saw for every replica (docs/gateway.md, "Live inputs")."""
    if await _api_user(request) is None:
        response = JsonResponse(
            {"error": {"code": "not_authenticated",
                       "message": "Authentication credentials were not provided.",
                       "details": {}}},
            status=401,
        )
        response["WWW-Authenticate"] = "Token"
        return response
    return JsonResponse(await gateway_stats())
