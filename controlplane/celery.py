"""The Celery application of the control plane's worker and beat; every task travels as JSON.

The control tasks are ``reconcile`` (one deployment, asked for after each change),
``reconcile_all`` and ``node_health_check`` (beat), all in ``deployments/tasks.py``, and
``calibrate`` (beat, ``telemetry/tasks.py``: docs/planner.md, "Calibration") and ``rebalance``
(beat, ``rebalance/tasks.py``: docs/deployments.md, "Rebalance policy"), named in
``contracts/tasks.py``. The agent tasks (``start_stage``, ``stop_stage``, ``sync``) are not run
here: the controller sends them by name (``deployments/dispatch.py``) to each node's own queue.

A worker's pool process traces its tasks where the ``OTEL_*`` variables ask (the gateway app connects
it: controlplane/gateway/traces/instrumentation.py); beat sends untraced.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("motley")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

