"""Per-key limits at admission: models a key may use, requests and tokens per minute, a token budget.

Called by the OpenAI views after the request is parsed and tokenized and before it is routed
(docs/gateway.md, "Quotas and rate limits"):

- ``requests_per_minute``: each admitted request counts 1 in the current window.
- ``tokens_per_minute`` and ``token_budget``: an admitted request reserves ``prompt + max_tokens``
  (the most it can cost) in the current window and in the budget's period; when it ends
  (``quota_settle``) the reservation is corrected to the tokens it was served (prompt + completion),
  so a finished request counts what it used and requests in flight can never together pass a limit.
- Windows are fixed: ``QUOTA_WINDOW_S`` seconds (60) aligned on the epoch; a refusal's
  ``Retry-After`` is the time to the window's end. Budget periods are UTC days or months.

The counters live in the cache every gateway process shares (counters.py: Redis in service mode, the
SQLite cache in the embedded default); a check and its increments are one atomic step, and a refused
request counts nowhere. A budget counter missing from the cache (first use in a period, a cache that
lost it) is seeded from the stored usage (usage.py) before it counts, once this process's usage still
queued for the database (usage_backlog.py) is written: a request that ended just before is counted. A
cache that cannot be reached lets the request through (logged): the limits fail open rather than stop
serving.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from controlplane.gateway.accounts.counters import Check, CounterStore
from controlplane.gateway.accounts.usage import usage_tokens
from controlplane.gateway.accounts.usage_backlog import flush as flush_usage
from controlplane.gateway.conf import gateway_setting
from controlplane.gateway.models import ApiKey, BudgetPeriod
from controlplane.gateway.openai.errors import OpenAIError, model_not_allowed, quota_exhausted, rate_limited

log = logging.getLogger(__name__)
clock = time.time  # tests replace it to step through windows without sleeping
_last_warning = [0.0]


@dataclass(frozen=True)
class Admission:
    """What an admitted request counted, so its end can correct the reservation."""

    at: float
    reserved_tokens: int = 0
    # (cache key, ttl_s) holding the reservation
    token_counters: tuple[tuple[str, int], ...] = field(default=())


def key_label(api_key: ApiKey) -> str:
    return f"'{api_key.name}' ({api_key.prefix}…)"


def check_model(api_key: ApiKey, model: str) -> None:
    """A key restricted to some models may use only those (403 ``model_not_allowed``)."""
    if api_key.allowed_models and model not in api_key.allowed_models:
        raise model_not_allowed(model, key=key_label(api_key), allowed=list(api_key.allowed_models))


def model_visible(api_key: ApiKey, model: str) -> bool:
    return not api_key.allowed_models or model in api_key.allowed_models


def window_s() -> float:
    return float(gateway_setting("QUOTA_WINDOW_S"))


def period_bounds(period: str, now: float) -> tuple[datetime, datetime]:
    """The UTC day or month holding ``now``."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == BudgetPeriod.DAY:
        return day, day + timedelta(days=1)
    start = day.replace(day=1)
    return start, (start + timedelta(days=32)).replace(day=1)


def _per_window() -> str:
    return "per minute" if window_s() == 60 else f"per {window_s():g} s window"


def quota_admit(
    *, api_key: ApiKey, prompt_tokens: int, max_tokens: int, store: CounterStore | None = None
) -> Admission:
    """Count the request against the key's limits, or raise the 429 naming the limit it would pass."""
    now = clock()
    if not api_key.limited:
        return Admission(now)
    store = store or CounterStore()
    window = window_s()
    start = math.floor(now / window) * window
    retry_after = max(1, math.ceil(start + window - now))
    window_ttl = max(2, math.ceil(2 * window))
    stamp = f"{round(start * 1000)}"
    need = prompt_tokens + max_tokens
    checks: list[Check] = []
    kinds: list[str] = []
    period_start = None
    if api_key.requests_per_minute is not None:
        checks.append(Check(f"quota:{api_key.pk}:rpm:{stamp}", 1, api_key.requests_per_minute, window_ttl))
        kinds.append("requests")
    if api_key.tokens_per_minute is not None:
        if need > api_key.tokens_per_minute:
            raise rate_limited(
                f"This request alone needs up to {need} tokens (prompt {prompt_tokens} + max_tokens "
                f"{max_tokens}), more than the rate limit of {api_key.tokens_per_minute} tokens "
                f"{_per_window()} of key {key_label(api_key)}: lower max_tokens or shorten the prompt.",
                retry_after_s=None, headers={"x-ratelimit-limit-tokens": str(api_key.tokens_per_minute)})
        checks.append(Check(f"quota:{api_key.pk}:tpm:{stamp}", need, api_key.tokens_per_minute, window_ttl))
        kinds.append("tokens")
    if api_key.token_budget is not None:
        period_start, period_end = period_bounds(api_key.budget_period, now)
        budget_ttl = math.ceil(period_end.timestamp() - now) + 3600
        budget_key = f"quota:{api_key.pk}:budget:{api_key.budget_period}:{period_start:%Y%m%d}"
        checks.append(Check(budget_key, need, api_key.token_budget, budget_ttl, seeded=True))
        kinds.append("budget")
    try:
        outcome = store.admit(checks)
        if outcome.missing is not None:  # the budget's counter: start it from what was served
            missing = checks[outcome.missing]
            flush_usage()
            store.seed(missing.key, usage_tokens(api_key_id=api_key.pk, since=period_start), missing.ttl_s)
            outcome = store.admit(checks)
    except Exception:  # the cache is down: serve rather than refuse everything
        if time.monotonic() - _last_warning[0] > 60:
            _last_warning[0] = time.monotonic()
            log.exception("quota counters unreachable: key limits are not enforced until they are back")
        return Admission(now)
    if not outcome.admitted:
        kind = kinds[outcome.refused or 0]
        raise _refusal(api_key, kind, outcome.current, need, prompt_tokens, max_tokens, retry_after, now)
    token_counters = tuple((c.key, c.ttl_s) for c, kind in zip(checks, kinds) if kind != "requests")
    return Admission(now, need if token_counters else 0, token_counters)


def _refusal(
    api_key: ApiKey, kind: str, current: int, need: int, prompt_tokens: int, max_tokens: int,
    retry_after: int, now: float,
) -> OpenAIError:
    label, per = key_label(api_key), _per_window()
    if kind == "requests":
        limit = api_key.requests_per_minute
        return rate_limited(
            f"Rate limit reached: the rate limit of {limit} requests {per} of key {label} is used "
            f"({current} made in this window); try again in {retry_after} s.",
            retry_after_s=retry_after, headers={"x-ratelimit-limit-requests": str(limit),
                                                "x-ratelimit-remaining-requests": "0"})
    if kind == "tokens":
        limit = api_key.tokens_per_minute
        return rate_limited(
            f"Rate limit reached: the rate limit of {limit} tokens {per} of key {label} would be passed: "
            f"{current} are counted in this window (served, or reserved by requests in flight) and this "
            f"request needs up to {need} (prompt {prompt_tokens} + max_tokens {max_tokens}); try again in "
            f"{retry_after} s or lower max_tokens.",
            retry_after_s=retry_after, headers={"x-ratelimit-limit-tokens": str(limit),
                                                "x-ratelimit-remaining-tokens": str(max(0, limit - current))})
    budget, period = api_key.token_budget, api_key.budget_period
    _, period_end = period_bounds(period, now)
    if need > budget:
        head = f"This request alone needs up to {need} tokens, more than"
    else:
        head = f"{current} tokens are used or reserved by requests in flight and this request needs up to " \
               f"{need} (prompt + max_tokens): that passes"
    return quota_exhausted(
        f"Token budget exhausted: {head} the budget of {budget} tokens per {period} of key {label}; it "
        f"resets at {period_end:%Y-%m-%dT%H:%M:%SZ}.",
        retry_after_s=None if need > budget else max(1, math.ceil(period_end.timestamp() - now)),
        headers={"x-ratelimit-limit-tokens": str(budget)})


def quota_settle(admission: Admission, *, used_tokens: int, store: CounterStore | None = None) -> None:
    """Correct the request's reservation to the tokens it was served (nothing if none was reserved)."""
    if not admission.token_counters:
        return
    delta = used_tokens - admission.reserved_tokens
    try:
        (store or CounterStore()).adjust([(key, delta, ttl) for key, ttl in admission.token_counters])
    except Exception:
        log.exception("correcting a request's quota reservation failed")
