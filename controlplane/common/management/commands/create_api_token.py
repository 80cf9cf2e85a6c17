"""``python manage.py create_api_token USER``: print an API token for scripts, and nothing else.

DRF's ``drf_create_token`` does the same with a sentence around the key; this one prints the bare
key so that ``TOKEN=$(python manage.py create_api_token alice)`` works.
"""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = (
        "Print USER's API token (created on first use); --reset replaces it. "
        "Send it as 'Authorization: Token <key>'."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument(
            "--reset", action="store_true", help="revoke the current token and issue a new one"
        )

    def handle(self, *args, **options):
        username = options["username"]
        try:
            user = get_user_model().objects.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            hint = f"python manage.py createsuperuser --username {username}"
            raise CommandError(f"no user {username!r}; create one first with: {hint}") from None
        if options["reset"]:
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
