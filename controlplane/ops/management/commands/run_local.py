"""`manage.py run_local`: the embedded default in one process tree (what `make run` starts)."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane.ops.process_group import ProcessGroup, python_argv, raise_keyboard_interrupt_on_sigterm
from controlplane.ops.services import admin_ensure


class Command(BaseCommand):
    help = "Start the ASGI server, a Celery worker and Celery beat; Ctrl-C stops everything started."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args, host: str, port: int, **options):
        account = admin_ensure(credentials_path=settings.VAR_DIR / "admin-credentials.txt")
        if account.created:
            self.stdout.write(f"Created superuser '{account.username}'; credentials in {account.credentials_path}")
        else:
            self.stdout.write(f"An admin account exists (first credentials, if generated: {account.credentials_path})")
        raise_keyboard_interrupt_on_sigterm()
        group = ProcessGroup()
        try:
            group.start("asgi", python_argv("-m", "daphne", "-b", host, "-p", str(port), "controlplane.asgi:application"))
            group.start(
                "celery",
                python_argv("-m", "celery", "-A", "controlplane.celery", "worker", "--loglevel", "INFO",
                            "--concurrency", "2", "--queues", "control"),
            )
            # Periodic control tasks: node health (heartbeats missed) and the level-triggered reconcile.
            group.start(
                "beat",
                python_argv("-m", "celery", "-A", "controlplane.celery", "beat", "--loglevel", "INFO",
                            "--schedule", str(settings.VAR_DIR / "celerybeat-schedule")),
            )
            base = f"http://{host}:{port}"
            self.stdout.write(f"motley is up: API {base}/api/v1/  schema {base}/api/schema/  docs {base}/api/docs/")
            name, code = group.first_exit()
            self.stderr.write(f"{name} exited with code {code}; stopping everything")
        except KeyboardInterrupt:
            self.stdout.write("stopping")
        finally:
            group.stop()
