"""Websocket routes of the dashboard, wrapped for browsers: session auth and an Origin check.

Only this route is origin-checked: agents on ``/ws/agents/`` are not browsers and send no Origin.
"""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from controlplane.dashboard.consumers import DashboardConsumer

websocket_urlpatterns = [
    path("ws/dashboard/", AllowedHostsOriginValidator(AuthMiddlewareStack(DashboardConsumer.as_asgi()))),
]
