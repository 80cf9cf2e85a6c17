"""What the rebalance tests do to the world and read back from it."""

from __future__ import annotations

from controlplane.deployments.models import DeploymentEvent
from controlplane.inventory.models import Node
from controlplane.rebalance.models import RebalanceProposal
from controlplane.telemetry.calibration import calibration_fit
from controlplane.telemetry.services import telemetry_keep, telemetry_sample
from tests.telemetry.test_calibration import devices_used, report

# A V100 of replica 0 (node-b/gpu2 holds layers [0, 17), node-b/gpu3 the rest)
SLOW = "node-b/gpu2"


def policy_events(deployment) -> list[DeploymentEvent]:
    return list(DeploymentEvent.objects.filter(deployment=deployment, kind=DeploymentEvent.Kind.POLICY)
                .order_by("at", "id"))


def proposals(deployment, **filters) -> list[RebalanceProposal]:
    return list(RebalanceProposal.objects.filter(deployment=deployment, **filters).order_by("id"))


def uncordon(name: str) -> None:
    Node.objects.filter(name=name).update(intent=Node.Intent.SCHEDULABLE)


def slow_stage_reported(deployment, *, at: float, ratio: float = 3.0) -> None:
    """Every stage's decode step as the agents would report it, SLOW's ``ratio`` times the prediction
    and the others as predicted; then the beat's calibration pass over it."""
    report(deployment, {name: ratio if name == SLOW else 1.0 for name in devices_used(deployment)}, at=at)
    calibration_fit(now=at)


def throttled_reported(*, node: str, node_id: int, index: int, at: float, clock: int = 420,
                       top: int = 1400) -> None:
    """A heartbeat of ``node`` whose card ``index`` reports a thermal slowdown at ``clock`` MHz."""
    devices = [{"index": index, "throttle_reasons": ["hw_thermal"], "sm_clock_mhz": clock,
                "sm_clock_max_mhz": top}]
    heartbeat = {"sent_at": at, "devices": devices, "stages": []}
    telemetry_keep(telemetry_sample(node_id=node_id, node_name=node, heartbeat=heartbeat, received_at=at))
