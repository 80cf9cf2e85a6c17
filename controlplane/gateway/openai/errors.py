"""Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with its status codes,
so OpenAI's own clients raise the exception a developer expects (BadRequestError, RateLimitError…)."""

from __future__ import annotations

from django.http import JsonResponse


class OpenAIError(Exception):
    def __init__(
        self, status: int, message: str, *, type: str, code: str | None = None, param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        if self.status == 401:
            response["WWW-Authenticate"] = "Bearer"
        for name, value in self.headers.items():
            response[name] = value
        return response


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, type="invalid_request_error", param=param, code=code)


def invalid_api_key() -> OpenAIError:
    return OpenAIError(
        401,
        "Incorrect or missing API key: send 'Authorization: Bearer <key>' with a key from the control plane.",
        type="invalid_request_error",
        code="invalid_api_key",
    )


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(
        404, f"The model {name!r} does not exist.",
        type="invalid_request_error", param="model", code="model_not_found",
    )


def model_not_deployed(name: str) -> OpenAIError:
    """A catalog model no deployment serves: nothing is coming, so no wait and no ``Retry-After``."""
    return OpenAIError(
        503, f"The model {name!r} has no deployment: deploy it (POST /api/v1/deployments/) to serve it.",
        type="server_error", param="model", code="service_unavailable",
    )


def model_not_allowed(name: str, *, key: str, allowed: list[str]) -> OpenAIError:
    return OpenAIError(
        403, f"The API key {key} may not use the model {name!r}; it is restricted to: {', '.join(allowed)}.",
        type="permission_error", param="model", code="model_not_allowed",
    )


def rate_limited(message: str, *, retry_after_s: int | None, headers: dict[str, str]) -> OpenAIError:
    """A key's own requests- or tokens-per-minute limit (quotas.py); ``Retry-After``: the window's end."""
    if retry_after_s is not None:
        headers = {"Retry-After": str(retry_after_s), **headers}
    return OpenAIError(429, message, type="rate_limit_exceeded", code="rate_limit_exceeded", headers=headers)


def quota_exhausted(message: str, *, retry_after_s: int | None, headers: dict[str, str]) -> OpenAIError:
    """A key's token budget for its day or month is spent; ``Retry-After``: the period's end."""
    if retry_after_s is not None:
        headers = {"Retry-After": str(retry_after_s), **headers}
    return OpenAIError(429, message, type="insufficient_quota", code="insufficient_quota", headers=headers)


def saturated(message: str, *, retry_after_s: int | None = None) -> OpenAIError:
    """429: the replicas are busy; ``retry_after_s``: when the queue ahead will have drained (shedding.py)."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return OpenAIError(429, message, type="rate_limit_error", code="server_saturated", headers=headers)


def unavailable(message: str, *, retry_after_s: int | None = None) -> OpenAIError:
    """503; ``retry_after_s``: when a retry may find a replica (after a wait, or a full queue)."""
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return OpenAIError(503, message, type="server_error", code="service_unavailable", headers=headers)


def deadline_exceeded(deadline_s: float) -> OpenAIError:
    return OpenAIError(
        504, f"The request did not finish within its deadline of {deadline_s:g} s.",
        type="server_error", code="deadline_exceeded",
    )


def method_not_allowed(method: str, allowed: tuple[str, ...]) -> OpenAIError:
    """A method the route does not take (405 with ``Allow``), in OpenAI's shape like every error here."""
    return OpenAIError(405, f"{method} is not allowed here; use {', '.join(allowed)}.",
                       type="invalid_request_error", code="method_not_allowed",
                       headers={"Allow": ", ".join(allowed)})
