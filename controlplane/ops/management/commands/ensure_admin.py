"""`manage.py ensure_admin`: the first superuser and its API token, once (the container's `web` command
runs it on every start; docs/docker.md). Its password is MOTLEY_ADMIN_PASSWORD when set, else generated
and written with the token to MOTLEY_VAR_DIR/admin-credentials.txt (mode 0600)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from contracts.env import env_str
from controlplane.ops.services import admin_ensure


class Command(BaseCommand):
    help = "Create the first superuser once (password: $MOTLEY_ADMIN_PASSWORD, else generated)."

    def handle(self, *args, **options):
        # Read when the command runs, not kept among the settings: a secret that nothing else needs.
        account = admin_ensure(credentials_path=settings.VAR_DIR / "admin-credentials.txt",
                               password=env_str("MOTLEY_ADMIN_PASSWORD", "") or None)
        if account.created:
            self.stdout.write(f"created superuser '{account.username}'; token in {account.credentials_path}")
        else:
            self.stdout.write("a superuser exists already; nothing changed")
