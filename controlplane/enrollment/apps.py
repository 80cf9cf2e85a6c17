from django.apps import AppConfig


class EnrollmentConfig(AppConfig):
    """How agents join: join tokens, node credentials, registration and the agents' websocket."""

    name = "controlplane.enrollment"
    label = "enrollment"
    verbose_name = "Enrollment"
