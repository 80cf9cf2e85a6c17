"""``manage.py create_api_key USERNAME [--name NAME]``: prints a new key for the gateway, once."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.gateway.services import api_key_create


class Command(BaseCommand):
    help = "Create an API key for the OpenAI-compatible gateway and print it (it is not stored)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="a label to tell the user's keys apart")

    def handle(self, *args, username: str, name: str, **options) -> None:
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        _, raw_key = api_key_create(user=user, name=name, actor=actor_cli())
        self.stdout.write(raw_key)
