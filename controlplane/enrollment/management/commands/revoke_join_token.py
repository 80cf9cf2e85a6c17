"""`manage.py revoke_join_token ID_OR_PREFIX`: agents can no longer join with that token."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from controlplane.audit.services import actor_cli
from controlplane.enrollment.models import JoinToken
from controlplane.enrollment.services import join_token_revoke


class Command(BaseCommand):
    help = "Revoke a join token by its id or its printed prefix; nodes that already joined keep working."

    def add_arguments(self, parser):
        parser.add_argument("token", help="the token's id, its prefix (mjt_…), or the token itself")

    def handle(self, *args, token: str, **options):
        matches = list(JoinToken.objects.filter(pk=int(token)) if token.isdigit()
                       else JoinToken.objects.filter(prefix__startswith=token[:12]))
        if len(matches) != 1:
            raise CommandError(f"{len(matches)} join tokens match {token!r}; give its id")
        revoked = join_token_revoke(join_token=matches[0], actor=actor_cli())
        self.stdout.write(f"revoked join token {revoked.pk} ({revoked.prefix}…)")
