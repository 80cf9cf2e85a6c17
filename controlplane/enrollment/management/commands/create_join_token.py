"""`manage.py create_join_token [--ttl 24h] [--description TEXT]`: print a new join token once."""

from __future__ import annotations

import re
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.enrollment.services import join_token_create

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``24h`` or ``7d``."""
    match = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if match is None:
        raise CommandError(f"--ttl: expected a duration like 90s, 15m, 24h or 7d, got {text!r}")
    return timedelta(seconds=int(match[1]) * UNITS[match[2] or "s"])


class Command(BaseCommand):
    help = "Create a join token for agents; it is printed once and stored only as a digest."

    def add_arguments(self, parser):
        parser.add_argument("--ttl", default="24h", help="lifetime: 90s, 15m, 24h, 7d (default 24h)")
        parser.add_argument("--description", default="", help="what the token is for")

    def handle(self, *args, ttl: str, description: str, **options):
        try:
            issued = join_token_create(ttl=parse_ttl(ttl), description=description, actor=actor_cli())
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from None
        token = issued.join_token
        expires = f"{token.expires_at:%Y-%m-%d %H:%M:%S} UTC"
        self.stderr.write(f"join token {token.pk} ({token.prefix}…) expires {expires}")
        self.stdout.write(issued.secret)
