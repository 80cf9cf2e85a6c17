"""Base classes the apps' APIs share, so every resource behaves the same way."""

from __future__ import annotations

import copy
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers, viewsets


class ValidatedModelSerializer(serializers.ModelSerializer):
    """Runs the model's ``full_clean()`` on what would be saved.

    The rules of a row (constraints, ``clean()``) live on the model once; the API, the admin and
    the services all enforce the same ones, and a request that breaks one gets a 400 naming the
    field, not a database error.
    """

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        instance = copy.copy(self.instance) if self.instance is not None else self.Meta.model()
        for field, value in attrs.items():
            setattr(instance, field, value)
        try:
            instance.full_clean()
        except DjangoValidationError as exc:
            raise serializers.ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
            ) from None
        return attrs


class ResourceViewSet(viewsets.ModelViewSet):
    """Declarative CRUD: a subclass names its queryset, serializer_class and filterset_class.

    Lists are ordered by default and may be reordered by any of ``ordering_fields`` with
    ``?ordering=``; subclasses keep their querysets free of N+1 lookups (tests count queries).
    """

    ordering_fields = "__all__"
