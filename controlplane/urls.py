"""URL map: the REST API under /api/v1/, its schema and docs, the admin and login pages."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane.common.docs import ApiDocsView
from controlplane.observability.views import metrics_view

api_v1 = [
    # Apps append their routers here (see each app's api/urls.py).
    path("", include("controlplane.inventory.api.urls")),
    path("", include("controlplane.models_catalog.api.urls")),
    path("", include("controlplane.plans.api.urls")),
    path("", include("controlplane.enrollment.api.urls")),
    path("", include("controlplane.deployments.api.urls")),
    path("", include("controlplane.telemetry.api.urls")),
    path("", include("controlplane.rebalance.api.urls")),
    path("", include("controlplane.gateway.api_urls")),
    path("", include("controlplane.audit.api.urls")),
]

handler404 = "controlplane.not_found.not_found"  # JSON under /api/ and /v1/

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="dashboard/login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/", include(api_v1)),
    path("v1/", include("controlplane.gateway.urls")),  # OpenAI-compatible, where its clients look
    path("", include("controlplane.gateway.root_urls")),  # vLLM's /health, /tokenize, /detokenize
    path("metrics", metrics_view, name="metrics"),  # Prometheus (docs/observability.md)
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", ApiDocsView.as_view(), name="api-docs"),
    # Interactive: try requests from the browser with the session (Swagger UI from the sidecar package).
    path("api/docs/try/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs-try"),
    path("", include("controlplane.dashboard.urls")),
]
