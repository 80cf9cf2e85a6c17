"""The gateway's part of the control-plane API, under /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.gateway import api, keys_api, usage_api

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("api-keys", keys_api.ApiKeyViewSet, basename="api-key")

urlpatterns = [
    path("gateway/router/", api.router_view, name="gateway-router"),
    path("usage/", usage_api.UsageView.as_view(), name="usage"),
    *router.urls,
]
