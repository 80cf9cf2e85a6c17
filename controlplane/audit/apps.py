from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Who changed what, when and from where: one row per operator or API action (docs/api.md, "Audit")."""

    name = "controlplane.audit"
    label = "audit"
    verbose_name = "Audit trail"
