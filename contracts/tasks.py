"""Names of the Celery tasks, defined once for the side that sends them and the side that runs them.

Agent tasks travel on the node's own queue (``names.node_queue``) with JSON keyword arguments:
``START_STAGE(stage_key, spec, device_index)``, ``STOP_STAGE(stage_key)``,
``SYNC(wanted_stage_keys)`` and ``SET_THROTTLE(device_index, factor)`` (an emulated device's throttle
knob) (docs/contracts.md §3). Controller tasks run on the control plane's worker; the controller
sends them by name, so sending one imports nothing of the task's module.
"""

START_STAGE = "motley.agent.start_stage"
STOP_STAGE = "motley.agent.stop_stage"
SYNC = "motley.agent.sync"
SET_THROTTLE = "motley.agent.set_throttle"

RECONCILE = "motley.deployments.reconcile"
RECONCILE_ALL = "motley.deployments.reconcile_all"
NODE_HEALTH_CHECK = "motley.deployments.node_health_check"
CALIBRATE = "motley.telemetry.calibrate"
REBALANCE_EVALUATE = "motley.rebalance.evaluate"
