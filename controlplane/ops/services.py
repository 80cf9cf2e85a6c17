"""Services for running a local installation."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token


@dataclass(frozen=True)
class AdminAccount:
    username: str
    created: bool
    credentials_path: Path


@transaction.atomic
def admin_ensure(
    *, credentials_path: Path, username: str = "admin", password: str | None = None
) -> AdminAccount:
    """Create a local superuser and an API token once, writing them to a file only the owner reads.
    The password is generated unless the operator gives one (containers: MOTLEY_ADMIN_PASSWORD),
    which the file then does not repeat.

    Nothing happens when any superuser exists already, so running it on every start is safe and an
    operator's own accounts are never touched.
    """
    user_model = get_user_model()
    if user_model.objects.filter(is_superuser=True).exists():
        return AdminAccount(username=username, created=False, credentials_path=credentials_path)
    shown = "(the one given)" if password else None
    password = password or secrets.token_urlsafe(12)
    user = user_model.objects.create_superuser(username=username, email="", password=password)
    token = Token.objects.create(user=user)
    credentials_path.parent.mkdir(parents=True, exist_ok=True)
    credentials_path.write_text(
        f"username: {username}\npassword: {shown or password}\napi_token: {token.key}\n"
    )
    credentials_path.chmod(0o600)
    return AdminAccount(username=username, created=True, credentials_path=credentials_path)
