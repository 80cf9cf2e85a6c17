"""The audit trail's one table: ``AuditEntry``, written only by ``services.audit_record``."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditEntry(models.Model):
    """One state-changing action: who (``actor``, ``actor_label``, ``via``), when (``at``), what
    (``action`` on ``target_*``, with ``detail``) and from where (``remote_addr``).

    Append-only: a stored entry is never changed nor deleted through the ORM's instance methods, the
    API, the admin or the dashboard. The target is kept by type, id and label, not as a foreign key,
    and the actor's label is kept next to the user, so an entry outlives what it names.
    """

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="audit_entries",
    )
    actor_label = models.CharField(
        max_length=200,
        help_text='Who, kept if the user is deleted: "admin", "cli:root", "system", "agent n1".',
    )
    via = models.CharField(
        max_length=20,
        help_text="How the actor came in: session, token, api_key, cli, admin, agent or system.",
    )
    action = models.CharField(max_length=64, db_index=True, help_text='A dotted verb, e.g. "plan.applied".')
    target_type = models.CharField(max_length=64, help_text='e.g. "deployment", "node", "api_key".')
    target_id = models.CharField(max_length=64, blank=True, default="")
    target_label = models.CharField(max_length=200, blank=True, default="")
    remote_addr = models.GenericIPAddressField(null=True, blank=True, unpack_ipv4=True)
    detail = models.JSONField(default=dict, blank=True, help_text="What changed, action by action.")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["target_type", "target_id"], name="audit_target")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_label} {self.action} {self.target_label}"

    def save(self, *args, **kwargs) -> None:
        if not self._state.adding:
            raise PermissionError("audit entries are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise PermissionError("audit entries are append-only")
