"""The gateway's part of the control-plane API, under /api/v1/."""

from django.urls import path

from controlplane.gateway import api

urlpatterns = [
    path("gateway/router/", api.router_view, name="gateway-router"),
]
