"""Secrets that let an agent join the fleet and then act as one node.

Both are random strings shown once and stored as SHA-256 digests: they carry 256 bits of entropy, so
a slow password hash buys nothing, while a digest lets a request be matched with one indexed lookup.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.common.models import TimestampedModel
from controlplane.inventory.models import Node


class JoinToken(TimestampedModel):
    """A bearer secret an operator hands to new agents; it expires and can be revoked."""

    description = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to tell tokens apart.")
    digest = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token, hex.")
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    uses = models.PositiveIntegerField(default=0)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.description or 'join token'})"

    @property
    def is_usable(self) -> bool:
        return self.revoked_at is None and self.expires_at > timezone.now()


class NodeCredential(TimestampedModel):
    """The secret of the node's current incarnation; each registration replaces it."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="credential")
    digest = models.CharField(max_length=64, help_text="SHA-256 of the credential, hex.")
    incarnation = models.PositiveIntegerField(
        help_text="The node's incarnation this credential was issued to."
    )
    join_token = models.ForeignKey(
        JoinToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"credential of {self.node} (incarnation {self.incarnation})"
