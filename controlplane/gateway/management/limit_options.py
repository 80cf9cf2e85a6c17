"""Options shared by ``create_api_key`` and ``set_api_key_limits``: a key's limits on the command line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from controlplane.gateway.models import BudgetPeriod


def _count(text: str) -> int | None:
    """A positive count, or ``none`` to lift the limit."""
    if text.lower() in ("none", "unlimited", "-"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise CommandError(f"{text!r} is not a count (a positive integer, or 'none')") from None
    if value < 0:
        raise CommandError(f"{text!r}: a count is 0 or more")
    return value


def add_limit_arguments(parser) -> None:
    parser.add_argument("--rpm", "--requests-per-minute", dest="requests_per_minute", type=str,
                        help="requests per minute (none: no limit)")
    parser.add_argument("--tpm", "--tokens-per-minute", dest="tokens_per_minute", type=str,
                        help="prompt + completion tokens per minute (none: no limit)")
    parser.add_argument("--budget", "--token-budget", dest="token_budget", type=str,
                        help="prompt + completion tokens per budget period (none: no budget)")
    parser.add_argument("--max-concurrent", "--max-concurrent-requests", dest="max_concurrent_requests",
                        type=str, help="requests in flight at once per gateway process (none: the gateway's)")
    parser.add_argument("--budget-period", choices=BudgetPeriod.values, help="day or month (UTC)")
    parser.add_argument("--model", dest="allowed_models", action="append", metavar="MODEL",
                        help="restrict the key to this model (repeat for several)")
    parser.add_argument("--all-models", action="store_true", help="lift a restriction to models")


def limits_from_options(options: dict[str, Any]) -> dict[str, Any]:
    """The limits the options name (those not given are left as they are)."""
    limits: dict[str, Any] = {}
    for name in ("requests_per_minute", "tokens_per_minute", "token_budget", "max_concurrent_requests"):
        if options.get(name) is not None:
            limits[name] = _count(options[name])
    if options.get("budget_period"):
        limits["budget_period"] = options["budget_period"]
    if options.get("all_models"):
        limits["allowed_models"] = []
    elif options.get("allowed_models"):
        limits["allowed_models"] = options["allowed_models"]
    return limits
