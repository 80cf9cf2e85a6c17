"""The gateway's limits by design, each a ``MOTLEY_GATEWAY`` setting with its default in conf.py:

- ``MAX_BODY_BYTES`` (1 MiB): a ``/v1/``, ``/tokenize`` or ``/detokenize`` request body larger is
  refused with ``413`` before it is read
  (``GatewayBodyLimit``, a middleware; far above any prompt a context holds);
- ``MAX_TOKENS`` (32768): a request asking for more output tokens is refused with ``400``, whatever
  the model's context (a context that cannot hold prompt + max_tokens is ``context_length_exceeded``);
- ``MAX_CONCURRENT_REQUESTS_PER_KEY`` (None): one key's requests in flight at once in a gateway
  process, streamed or not, for keys without their own ``max_concurrent_requests`` (set per key, as
  the quotas are); one more is refused with ``429`` until one ends. Off by default: a client's
  overload queues (serving/admission.py) as on other OpenAI-compatible servers, and the queue's
  bound sheds it; an operator limits a key that must not hold every slot of the replicas.

Errors are OpenAI-shaped (openai/errors.py). ``None`` lifts a limit.
"""

from __future__ import annotations

from collections import Counter

from django.http import HttpRequest, HttpResponse

from controlplane.common.body_limit import BodyLimitMiddleware, gateway_path
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.openai.errors import OpenAIError, bad_request

_in_flight: Counter[int] = Counter()  # API key id -> requests admitted and not yet ended, in this process


def limit_setting(name: str) -> int | None:
    return gateway_setting(name)


def max_tokens_check(max_tokens: int) -> None:
    limit = limit_setting("MAX_TOKENS")
    if limit is not None and max_tokens > limit:
        raise bad_request(f"max_tokens is {max_tokens}, above this gateway's limit of {limit} "
                          "(MOTLEY_GATEWAY['MAX_TOKENS']); ask for fewer", param="max_tokens",
                          code="max_tokens_too_large")


def concurrency_acquire(api_key_id: int, label: str, key_limit: int | None) -> None:
    """Count one more request in flight for the key, or raise the 429 when it has its limit already:
    ``key_limit`` (the key's own), else the gateway's."""
    limit = key_limit if key_limit is not None else limit_setting("MAX_CONCURRENT_REQUESTS_PER_KEY")
    if limit is not None and (count := _in_flight[api_key_id]) >= limit:
        raise OpenAIError(
            429, f"Too many concurrent requests: key {label} has {count} requests in flight, "
            "the most allowed (the key's max_concurrent_requests, else "
            "MOTLEY_GATEWAY['MAX_CONCURRENT_REQUESTS_PER_KEY']); "
            "send the next one when one of them has ended.",
            type="rate_limit_exceeded", code="too_many_concurrent_requests")
    _in_flight[api_key_id] += 1


def concurrency_release(api_key_id: int) -> None:
    _in_flight[api_key_id] -= 1
    if _in_flight[api_key_id] <= 0:
        del _in_flight[api_key_id]


class GatewayBodyLimit(BodyLimitMiddleware):
    """The gateway's bodies over ``MAX_BODY_BYTES``: 413 in OpenAI's shape."""

    def limit_for(self, request: HttpRequest) -> int | None:
        return limit_setting("MAX_BODY_BYTES") if gateway_path(request.path) else None

    def refusal(self, limit: int) -> HttpResponse:
        return OpenAIError(413, f"The request body is larger than this gateway's limit of {limit} bytes "
                           "(MOTLEY_GATEWAY['MAX_BODY_BYTES']).", type="invalid_request_error",
                           code="request_too_large").response()
