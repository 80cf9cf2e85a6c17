"""The gateway's part of the control-plane API, under /api/v1/."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.gateway import demand_api
from controlplane.gateway.accounts import keys_api, usage_api
from controlplane.gateway.serving import router_api
from controlplane.gateway.traces import api as traces_api

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
router.register("api-keys", keys_api.ApiKeyViewSet, basename="api-key")

urlpatterns = [
    path("gateway/router/", router_api.router_view, name="gateway-router"),
    path("usage/", usage_api.UsageView.as_view(), name="usage"),
    path("deployments/<int:pk>/demand/", demand_api.DeploymentDemandView.as_view(), name="deployment-demand"),
    path("traces/", traces_api.TraceListView.as_view(), name="trace-list"),
    path("traces/otlp/", traces_api.otlp_receive, name="trace-otlp"),
    path("traces/<str:trace_id>/", traces_api.TraceDetailView.as_view(), name="trace-detail"),
    *router.urls,
]
