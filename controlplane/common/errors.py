"""One JSON error shape for every API error, with a message a person can act on."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Model, ProtectedError, RestrictedError
from django.http import Http404
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


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "the request conflicts with the current state"
    default_code = "conflict"


MAX_REFERRERS_NAMED = 5


def reference_label(obj: Model) -> str:
    """How a row is named in a message: ``obj.reference_label()`` when the model says (a stage names
    its deployment), else its verbose name and ``str()``, e.g. "node lab-a"."""
    label = getattr(obj, "reference_label", None)
    return label() if callable(label) else f"{obj._meta.verbose_name} {obj}"


def _deleted_object(context: dict[str, Any]) -> Model | None:
    view = context.get("view")
    try:
        return view.get_object() if view is not None and hasattr(view, "get_object") else None
    except Exception:  # only for the message: a view without one object still gets its 409
        return None


def _conflict_from(exc: ProtectedError | RestrictedError, context: dict[str, Any]) -> Conflict:
    """A delete refused because other rows still reference the row: say which ones."""
    referrers = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
    labels = sorted({reference_label(o) for o in referrers})
    named = ", ".join(labels[:MAX_REFERRERS_NAMED])
    if len(labels) > MAX_REFERRERS_NAMED:
        named += f" and {len(labels) - MAX_REFERRERS_NAMED} more"
    target = _deleted_object(context)
    subject = reference_label(target) if target is not None else "it"
    return Conflict(f"{subject} is used by {named}; remove or move those first")


def json_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Render errors as {"error": {"code", "message", "details"}}.

    Django's ValidationError raised by a service becomes a 400 like a serializer error, so services
    stay free of DRF; Django's Http404 (``get_object``, an unknown ``?format=``) a ``not_found``; a
    delete refused by a PROTECT/RESTRICT foreign key is a 409 naming the rows that still reference it.
    """
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    elif isinstance(exc, (ProtectedError, RestrictedError)):  # a delete of a row still referenced
        exc = _conflict_from(exc, context)
    elif isinstance(exc, Http404):  # as DRF would, but keeping the code "not_found" (not "error")
        exc = exceptions.NotFound(*exc.args)
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
