"""API keys: the Bearer tokens OpenAI clients send. Only a hash is stored; the key is shown once."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from controlplane.common.models import TimestampedModel


class ApiKey(TimestampedModel):
    """A user's key for the /v1/ endpoints; revoking it (``revoked_at``) stops it at once.

    Keys are 256-bit random strings, so a plain SHA-256 is as strong as a slow password hash here and
    lets the gateway find a key by its hash in one indexed lookup. ``prefix`` (the first characters)
    lets a person tell keys apart in lists without revealing them.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None
