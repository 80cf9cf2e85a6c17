"""``GET /health``: 200 when the gateway can serve at least one model, else 503 saying why.

Unauthenticated, as vLLM's: probes and load balancers call it without a key, and it tells only
yes or no and a fixed reason (readiness.py). The 503 is OpenAI's error shape, as every gateway error.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from controlplane.gateway.openai.endpoint import endpoint
from controlplane.gateway.openai.errors import unavailable
from controlplane.gateway.serving.readiness import gateway_readiness


@endpoint("GET")
async def health_view(request: HttpRequest) -> HttpResponse:
    readiness = await gateway_readiness()
    if not readiness.ok:
        return unavailable(f"The gateway cannot serve any model: {readiness.reason}.").response()
    return JsonResponse({"status": "ok"})
