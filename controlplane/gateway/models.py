"""API keys (the Bearer tokens OpenAI clients send; only a hash is stored, the key is shown once), their
limits, and the usage they made in time buckets."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from controlplane.common.models import TimestampedModel


class BudgetPeriod(models.TextChoices):
    DAY = "day", "per day (UTC)"
    MONTH = "month", "per month (UTC)"


def validate_model_names(value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(name, str) and name.strip() for name in value):
        raise ValidationError("a list of model names (empty: every model)", code="invalid")


class ApiKey(TimestampedModel):
    """A user's key for the /v1/ endpoints; revoking it (``revoked_at``) stops it at once.

    Keys are 256-bit random strings, so a plain SHA-256 is as strong as a slow password hash here and
    lets the gateway find a key by its hash in one indexed lookup. ``prefix`` (the first characters)
    lets a person tell keys apart in lists without revealing them.

    Limits (docs/gateway.md, "Quotas"): None is no limit. ``requests_per_minute`` and
    ``tokens_per_minute`` count in fixed windows of a minute; ``token_budget`` is prompt + completion
    tokens per ``budget_period`` (a UTC day or month); ``allowed_models`` restricts the key to those
    served models (empty: all); ``max_concurrent_requests``: the key's requests in flight at once in a
    gateway process (None: the gateway's ``MAX_CONCURRENT_REQUESTS_PER_KEY``, itself None by default,
    so a key's overload queues like anyone's instead of being refused).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    key_hash = models.CharField(max_length=64, unique=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    requests_per_minute = models.PositiveIntegerField(null=True, blank=True)
    tokens_per_minute = models.PositiveIntegerField(null=True, blank=True)
    token_budget = models.PositiveBigIntegerField(null=True, blank=True)
    budget_period = models.CharField(max_length=8, choices=BudgetPeriod.choices, default=BudgetPeriod.MONTH)
    allowed_models = models.JSONField(default=list, blank=True, validators=[validate_model_names])
    max_concurrent_requests = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    @property
    def limited(self) -> bool:
        """Whether admission has anything to count for this key (else it touches no counter)."""
        return any(v is not None for v in (self.requests_per_minute, self.tokens_per_minute,
                                           self.token_budget))


class UsageBucket(models.Model):
    """What one key made of one model in one minute: requests admitted, tokens served, errors, refusals.

    Written once per request at its end (``usage.usage_record``: an atomic increment of the row), with
    the figures the gateway returned in ``usage``; the request counts in the minute it was admitted.
    ``user`` is the key's, kept here so usage groups by user without a join.
    """

    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="usage")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=200)
    bucket_start = models.DateTimeField()
    requests = models.PositiveBigIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    errors = models.PositiveBigIntegerField(default=0)
    # 429s of the key's own limits (not counted in requests)
    refused = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["api_key", "model", "bucket_start"], name="usage_bucket_unique"),
        ]
        indexes = [models.Index(fields=["bucket_start"]), models.Index(fields=["user", "bucket_start"])]

    def __str__(self) -> str:
        return f"{self.api_key_id}/{self.model}@{self.bucket_start:%Y-%m-%d %H:%M}"


from controlplane.gateway.traces.models import TraceSpan  # noqa: E402, F401 (the app's models, for Django)
