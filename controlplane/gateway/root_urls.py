"""vLLM's routes outside ``/v1/``, where its clients and probes look: health and tokenization."""

from django.urls import path

from controlplane.gateway.openai import tokenize_views
from controlplane.gateway.serving import health_api

urlpatterns = [
    path("health", health_api.health_view, name="gateway-health"),
    path("tokenize", tokenize_views.tokenize_view, name="gateway-tokenize"),
    path("detokenize", tokenize_views.detokenize_view, name="gateway-detokenize"),
]
