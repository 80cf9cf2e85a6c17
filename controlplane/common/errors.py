"""One JSON error shape for every API error, with a message a person can act on."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler


def _flatten(detail: Any, prefix: str = "") -> list[str]:
    """Turn DRF's nested error detail into 'field: message' lines."""
    if isinstance(detail, dict):
        lines = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            lines += _flatten(value, f"{prefix}.{name}" if prefix and name else (name or prefix))
        return lines
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, prefix)]
    return [f"{prefix}: {detail}" if prefix else str(detail)]


def json_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render errors as {"error": {"code", "message", "details"}}.

    Django's ValidationError raised by a service becomes a 400 like a serializer error, so services
    stay free of DRF.
    """
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    response = exception_handler(exc, context)
    if response is None:
        return None
    details = response.data
    lines = _flatten(details)
    code = getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else getattr(exc, "default_code", "invalid")
    response.data = {
        "error": {
            "code": code,
            "message": "; ".join(lines) or status.HTTP_400_BAD_REQUEST,
            "details": details,
        }
    }
    return response
