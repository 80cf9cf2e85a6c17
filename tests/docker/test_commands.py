"""The management commands the containers run (docker/entrypoint.sh), without docker: the first
admin with an operator's password (never written back to a file), and the demo's secret files."""

from __future__ import annotations

import stat

import pytest
from django.contrib.auth import authenticate
from django.core.management import call_command

from controlplane.ops.management.commands.demo_setup import secret_write


@pytest.mark.django_db
def test_ensure_admin_takes_the_password_from_the_environment_and_does_not_repeat_it(
    settings, tmp_path, monkeypatch
):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("MOTLEY_ADMIN_PASSWORD", "correct-horse-battery")
    call_command("ensure_admin")
    call_command("ensure_admin")  # every start runs it: the second changes nothing

    assert authenticate(username="admin", password="correct-horse-battery") is not None
    credentials = (tmp_path / "admin-credentials.txt").read_text()
    assert "correct-horse-battery" not in credentials and "api_token: " in credentials
    assert stat.S_IMODE((tmp_path / "admin-credentials.txt").stat().st_mode) == 0o600


@pytest.mark.django_db
def test_ensure_admin_generates_a_password_when_none_is_given(settings, tmp_path, monkeypatch):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("MOTLEY_ADMIN_PASSWORD", raising=False)
    call_command("ensure_admin")

    lines = dict(line.split(": ", 1)
                 for line in (tmp_path / "admin-credentials.txt").read_text().splitlines())
    assert authenticate(username="admin", password=lines["password"]) is not None


def test_secret_write_replaces_the_file_readable_by_its_owner_only(tmp_path):
    path = tmp_path / "shared" / "join-token"
    secret_write(path, "old")
    path.chmod(0o644)
    secret_write(path, "mjt_new")

    assert path.read_text() == "mjt_new\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
