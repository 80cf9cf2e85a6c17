"""The Celery application: control tasks (plan, reconcile, deploy) travel as JSON over the broker."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("motley")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
