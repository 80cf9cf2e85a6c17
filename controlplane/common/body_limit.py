"""Request bodies over a limit are refused with 413 before anything reads them.

Django holds ``request.body`` to ``DATA_UPLOAD_MAX_MEMORY_SIZE`` only when something reads it that
way; DRF's parsers read the stream, so without this middleware an API request body had no limit. The
API's limit is ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (settings.py, env ``MOTLEY_API_MAX_BODY_BYTES``); the
gateway's routes (``/v1/``, ``/tokenize``, ``/detokenize``) have their own
(controlplane/gateway/limits.py), in OpenAI's error shape.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

GATEWAY_ROOT_PATHS = frozenset({"/tokenize", "/detokenize"})  # vLLM's, outside /v1/


def gateway_path(path: str) -> bool:
    """A route of the gateway, whose bodies the gateway limits."""
    return path.startswith("/v1/") or path in GATEWAY_ROOT_PATHS


class BodyLimitMiddleware:
    """Refuse a body whose declared length, or (none declared) whose size, is over ``limit_for``."""

    sync_capable = async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def limit_for(self, request: HttpRequest) -> int | None:
        """The limit of this request's body, None: none here."""
        if gateway_path(request.path):
            return None
        return settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    def refusal(self, limit: int) -> HttpResponse:
        message = (f"the request body is larger than the API's limit of {limit} bytes "
                   "(MOTLEY_API_MAX_BODY_BYTES)")
        return JsonResponse({"error": {"code": "request_too_large", "message": message, "details": {}}},
                            status=413)

    def _refused(self, request: HttpRequest) -> HttpResponse | None:
        limit = self.limit_for(request)
        if limit is None or request.method not in ("POST", "PUT", "PATCH"):
            return None
        declared = request.headers.get("Content-Length", "")
        try:
            size = int(declared) if declared.isdigit() else len(request.body) if not declared else 0
        except RequestDataTooBig:  # no length declared, and over Django's own limit
            return self.refusal(limit)
        return self.refusal(limit) if size > limit else None

    def __call__(self, request: HttpRequest):
        if self.is_async:
            return self._acall(request)
        return self._refused(request) or self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        return self._refused(request) or await self.get_response(request)
