"""Reads of the audit trail: newest first, filtered as the API and the dashboard ask."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from controlplane.audit.models import AuditEntry


def audit_entry_list(
    *, actor: str | None = None, action: str | None = None, target_type: str | None = None,
    target_id: str | None = None, since: datetime | None = None,
) -> QuerySet[AuditEntry]:
    """Entries newest first. ``actor``: a label or a username (case-insensitive); ``action``: a prefix
    (``plan`` or ``plan.`` for every plan action, ``node.drained`` for one)."""
    entries = AuditEntry.objects.select_related("actor")
    if actor:
        entries = entries.filter(Q(actor_label__iexact=actor) | Q(actor__username__iexact=actor))
    if action:
        entries = entries.filter(action__startswith=action)
    if target_type:
        entries = entries.filter(target_type=target_type)
    if target_id:
        entries = entries.filter(target_id=target_id)
    if since is not None:
        entries = entries.filter(at__gte=since)
    return entries.order_by("-at", "-id")
