from django.urls import path

from controlplane.telemetry.api import views

urlpatterns = [
    path("telemetry/", views.LatestTelemetryView.as_view(), name="telemetry-latest"),
]
