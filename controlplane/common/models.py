"""Abstract bases shared by the apps' models."""

from django.core.exceptions import ValidationError
from django.db import models


class TimestampedModel(models.Model):
    created = models.DateTimeField(auto_now_add=True)
    last_updated = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def validate_positive(value: float) -> None:
    if value <= 0:
        raise ValidationError(
            "must be greater than 0, got %(value)s", params={"value": value}, code="min_value"
        )
