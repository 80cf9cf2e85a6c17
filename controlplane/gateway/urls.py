"""The OpenAI-compatible API, mounted at /v1/ (outside /api/v1/, where OpenAI clients expect it)."""

from django.urls import path

from controlplane.gateway.openai import views

urlpatterns = [
    path("models", views.models_view, name="gateway-models"),
    path("completions", views.completions_view, name="gateway-completions"),
    path("chat/completions", views.chat_completions_view, name="gateway-chat-completions"),
]
