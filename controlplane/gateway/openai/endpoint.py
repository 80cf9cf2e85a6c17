"""What every authenticated gateway view shares: the API key check and the boundary decorator.

The OpenAI routes under ``/v1/`` and vLLM's ``/tokenize`` and ``/detokenize`` take the same keys and
answer the same errors, so they pass through this one place.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from controlplane.gateway.accounts.quotas import check_model
from controlplane.gateway.accounts.selectors import api_key_active
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.models import ApiKey
from controlplane.gateway.openai.errors import invalid_api_key, method_not_allowed, unavailable
from controlplane.gateway.serving.admission import model_unserved
from controlplane.gateway.serving.runtime import ModelRoute, gateway

log = logging.getLogger(__name__)


async def authenticate(request: HttpRequest) -> ApiKey:
    """The active key of ``Authorization: Bearer <key>``; raises the 401 otherwise."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    api_key = (await api_key_active(raw_key=key.strip())
               if scheme.lower() == "bearer" and key.strip() else None)
    if api_key is None:
        raise invalid_api_key()
    return api_key


def endpoint(*methods: str) -> Callable:
    """The boundary of every gateway view: a method it does not take is a 405 and a database it
    cannot reach a 503 with ``Retry-After``, both in OpenAI's shape (Django would answer an empty 405
    and an HTML 500). CSRF-exempt: the key comes in a header, not a cookie, so a forged cross-site
    request has nothing to ride on."""
    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        async def checked(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                return method_not_allowed(request.method, methods).response()
            try:
                return await view(request, *args, **kwargs)
            except DatabaseError as exc:
                log.warning("%s %s: the database is unreachable: %s", request.method, request.path, exc)
                return unavailable("The control plane's database cannot be reached; retry shortly.",
                                   retry_after_s=gateway_setting("RETRY_AFTER_S")).response()
        return csrf_exempt(checked)
    return decorate


async def model_route(api_key: ApiKey, model: str) -> ModelRoute:
    """The served model a request names: 403 if the key may not use it, 404 if the catalog does not
    know it, 503 if no deployment serves it."""
    check_model(api_key, model)
    route = await gateway().route(model)
    if route is None:
        raise await model_unserved(model)
    return route
