"""Registration attempts per address: a join token is a secret worth guessing, so one address may try
at most ``MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE`` times a minute (0: no limit); one more is a 429 with
``Retry-After``. The count is in the shared cache, so it holds across the server's processes; the address is
``client_address``'s (DRF's own reading would take any client's ``X-Forwarded-For``)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from controlplane.common.client_address import client_address


class RegistrationThrottle(SimpleRateThrottle):
    scope = "agent_register"

    def get_rate(self) -> str | None:
        limit = settings.MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE
        return f"{limit}/min" if limit else None

    def get_cache_key(self, request, view) -> str:
        return self.cache_format % {"scope": self.scope, "ident": client_address(request) or "unknown"}
