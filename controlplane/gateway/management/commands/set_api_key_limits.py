"""``manage.py set_api_key_limits PREFIX [--rpm N|none] [--tpm N|none] [--budget N|none]
[--budget-period day|month] [--model NAME …|--all-models]``: change a key's limits (audited), and print
them. The key is named by its prefix (``mk-AbCdEf``, as lists show it) or its id."""

import json

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.gateway.accounts.services import api_key_limits, api_key_set_limits
from controlplane.gateway.management.limit_options import add_limit_arguments, limits_from_options
from controlplane.gateway.models import ApiKey


class Command(BaseCommand):
    help = "Set an API key's rate limits, token budget and allowed models; prints its limits."

    def add_arguments(self, parser) -> None:
        parser.add_argument("key", help="the key's prefix (mk-AbCdEf) or id")
        add_limit_arguments(parser)

    def handle(self, *args, key: str, **options) -> None:
        keys = (ApiKey.objects.filter(pk=int(key)) if key.isdigit()
                else ApiKey.objects.filter(prefix=key.rstrip("…")))
        found = list(keys[:2])
        if len(found) != 1:
            raise CommandError(f"{'no' if not found else 'more than one'} API key {key!r}")
        try:
            api_key = api_key_set_limits(api_key=found[0], actor=actor_cli(), **limits_from_options(options))
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}"
                                         for k, v in exc.message_dict.items())) from None
        self.stdout.write(json.dumps({"key": str(api_key), **api_key_limits(api_key)}))
