from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    """Live samples from the agents, kept briefly and broadcast to dashboards."""

    name = "controlplane.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"
