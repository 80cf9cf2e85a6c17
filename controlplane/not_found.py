"""The 404 of a URL no route matches: JSON where a program is calling, Django's page elsewhere; a
websocket to such a path is refused at its handshake.

Router patterns refuse an id with a dot (``/api/v1/nodes/1.5/``), so such a request never reaches a
view and its exception handler: without this, an API client got an HTML page instead of the API's
error shape (found by the schema fuzz tests, tests/fuzz/). Under ``/v1/`` the answer is OpenAI's shape,
as every other gateway error.
"""

from __future__ import annotations

import logging

from channels.generic.websocket import AsyncWebsocketConsumer
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import page_not_found

from controlplane.gateway.openai.errors import OpenAIError

log = logging.getLogger(__name__)
NO_SUCH_SOCKET = 4404  # the close code a test client sees; a server answers a refused handshake with 403


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    message = f"no such URL: {request.path}"
    if request.path.startswith("/api/"):
        return JsonResponse({"error": {"code": "not_found", "message": message, "details": {}}}, status=404)
    if request.path.startswith("/v1/"):
        return OpenAIError(404, message, type="invalid_request_error", code="not_found").response()
    return page_not_found(request, exception)


class NoSuchSocket(AsyncWebsocketConsumer):
    """The last websocket route: any path the others do not match. Channels' router raises for a path
    it cannot route, which the server answered with HTTP 500 and a traceback per attempt."""

    async def connect(self) -> None:
        log.info("websocket refused: no such path %s", self.scope.get("path"))
        await self.close(code=NO_SUCH_SOCKET)
