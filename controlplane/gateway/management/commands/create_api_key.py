"""``manage.py create_api_key USERNAME [--name NAME] [limits]``: prints a new key for the gateway, once.

Limits (docs/gateway.md, "Quotas"): ``--rpm N``, ``--tpm N``, ``--budget N --budget-period day|month``,
``--model NAME`` (repeatable: the key may use only those models).
"""

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.management.limit_options import add_limit_arguments, limits_from_options


class Command(BaseCommand):
    help = "Create an API key for the OpenAI-compatible gateway and print it (it is not stored)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="a label to tell the user's keys apart")
        add_limit_arguments(parser)

    def handle(self, *args, username: str, name: str, **options) -> None:
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        try:
            _, raw_key = api_key_create(user=user, name=name, actor=actor_cli(),
                                        limits=limits_from_options(options))
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}"
                                         for k, v in exc.message_dict.items())) from None
        self.stdout.write(raw_key)
