"""Plan revisions: store a plan as a draft, check that one can be deployed now, and plan again.

This is where a stored plan meets the fleet as it is now, and the only place that does: an operator
action, the controller's re-plan after a loss and a drain all check a revision here before anything
is written, so they refuse for the same reasons with the same messages. Nothing here touches a
deployment's stages (``desired_state.py`` writes them from a ``CheckedPlan``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError

from contracts.hardware import FleetSpec
from contracts.model_profile import ModelProfile
from controlplane.deployments.degrade import degraded_plan, emergency_request, measured_low_bits
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.plan_request_form import plan_request_from_dict
from controlplane.deployments.selectors import devices_in_use, plan_devices, planning_only_message
from controlplane.inventory.models import Device, Node
from controlplane.inventory.selectors import fleet_spec_from_inventory
from controlplane.models_catalog.models import LlmModel
from controlplane.planning import Plan, PlanningError, PlanRequest, check, least_change_plan, plan_to_dict
from controlplane.planning.plan import StagePlan


def plan_revision_create(
    *, model: LlmModel, plan: dict[str, Any], request: dict[str, Any], source: str,
    deployment: Deployment | None = None, degraded_from: dict[str, Any] | None = None,
) -> PlanRevision:
    """Store a plan as a DRAFT revision; nothing runs until it is applied to a deployment.
    ``degraded_from``: the request ``request`` stands in for, when it asks a smaller workload."""
    if deployment is not None and deployment.model_id != model.pk:
        raise ValidationError({"model": f"the deployment serves {deployment.model}, not {model}"})
    return PlanRevision.objects.create(
        model=model, plan=plan, request=request, source=source, deployment=deployment,
        degraded_from=degraded_from,
    )


@dataclass(frozen=True)
class CheckedPlan:
    """A revision found deployable, with the stages it asks for on the devices as they are now."""

    revision: PlanRevision
    replicas: list[list[tuple[Device, StagePlan]]]  # per replica, per stage: device, priced stage
    batch: int  # sequences the plan was priced for (each stage's spec carries it)
    workload_kv_tokens: int  # batch x context: the KV one replica's workload needs on every stage
    micro_batches: list[int]  # per replica: micro-batches its head keeps in flight
    devices: dict[str, Device]  # every device the plan names (tensor-parallel ranks too), by name


def plan_revision_check(
    *, revision: PlanRevision, deployment: Deployment | None = None, exclude_nodes: tuple[Node, ...] = ()
) -> CheckedPlan:
    """Whether this revision can be deployed now (by ``deployment``, None for a new one).

    ValidationError lists every reason it cannot. Beyond the planner's own checks (layers, memory,
    precision, pins) a deployment needs weights, and devices whose node has a live agent and that
    no other deployment uses: a device on a LOST, cordoned or draining node, on a node no agent
    ever registered, or carrying another deployment's stage is refused by name.
    """
    model = revision.model
    if not model.has_weights:
        raise ValidationError({"model": planning_only_message(model)})
    busy = devices_in_use(deployment=deployment)
    devices, problems = plan_devices(revision.plan, busy=busy, exclude_nodes=exclude_nodes)
    if problems:
        raise ValidationError({"plan": problems})
    try:
        request = plan_request_now(revision=revision, busy=busy, exclude_nodes=exclude_nodes)
    except PlanningError as exc:
        raise ValidationError({"request": str(exc)}) from None
    problems, edited = check(revision.plan, request)  # not validate: the planner's own plan is not needed
    if problems:
        raise ValidationError({"plan": [p.message for p in problems]})
    return CheckedPlan(
        revision=revision,
        replicas=[[(devices[s.device], s) for s in replica.stages] for replica in edited.replicas],
        batch=edited.batch,
        workload_kv_tokens=edited.batch * edited.context,
        micro_batches=[replica.micro_batches for replica in edited.replicas],
        devices=devices,
    )


def replan_revision_create(
    *, deployment: Deployment, source: str, exclude_nodes: tuple[Node, ...] = (), degrade: bool = False,
) -> PlanRevision:
    """A draft revision answering the deployment's full question again (the request a degraded revision
    stands in for), on the fleet as it is now (without ``exclude_nodes`` and other deployments'
    devices); PlanningError when nothing fits. ``degrade``: when the full question does not fit, the
    largest workload that does (degrade.py), the revision keeping the full one in ``degraded_from``;
    last, on the deployment's emergency quality budget where its operator set one (``emergency_max_kl``).

    The applied plan with only its stranded stages moved is preferred to a fresh plan unless the fresh
    one serves enough better to pay for the stages it changes beyond the repair
    (``planning.least_change_plan`` with ``MOTLEY_REPLAN_KEEP_WITHIN``): a fresh plan usually moves
    every boundary, which restarts every stage and pauses the pipeline for all of them."""
    applied = deployment.revision
    asked = applied.degraded_from or applied.request
    busy, fleet = devices_in_use(deployment=deployment), registered_fleet()

    def plan_for(request: dict[str, Any]) -> Plan:
        on_fleet = request_on_fleet(request, model=deployment.model, busy=busy, fleet=fleet,
                                    exclude_nodes=exclude_nodes)
        return least_change_plan(applied.plan, on_fleet, keep_within=settings.MOTLEY_REPLAN_KEEP_WITHIN)

    try:
        request, chosen, degraded_from = asked, plan_for(asked), None
    except PlanningError:
        if not degrade:
            raise
        request, chosen = degraded_plan(asked, plan_for, lowered=_emergency(deployment, asked))
        degraded_from = asked
    return plan_revision_create(
        model=deployment.model, plan=plan_to_dict(chosen), request=request, source=source,
        deployment=deployment, degraded_from=degraded_from,
    )


def _emergency(deployment: Deployment, asked: dict[str, Any]) -> dict[str, Any] | None:
    """``asked`` on the deployment's emergency quality budget; None where its operator allows none."""
    if deployment.emergency_max_kl is None:
        return None
    profile = ModelProfile.from_dict(deployment.model.profile)
    return emergency_request(asked, max_kl=deployment.emergency_max_kl, low_bits=measured_low_bits(profile))


def registered_fleet(*, name: str = "inventory") -> FleetSpec:
    """The fleet of nodes an agent ever registered, as the planner sees it now: lost, cordoned and
    draining nodes and unhealthy devices down (``fleet_spec_from_inventory``)."""
    registered = Node.objects.filter(incarnation__gt=0).values_list("pk", flat=True)
    return fleet_spec_from_inventory(node_ids=registered, name=name)


def plan_request_now(
    *, revision: PlanRevision, busy: Iterable[str], fleet: FleetSpec | None = None,
    exclude_nodes: tuple[Node, ...] = (),
) -> PlanRequest:
    """The revision's request on ``fleet`` (default: ``registered_fleet()``) without the ``busy``
    devices (``devices_in_use``: those other deployments use) and ``exclude_nodes``; PlanningError
    when the request does not fit that fleet at all."""
    return request_on_fleet(revision.request, model=revision.model, busy=busy,
                            fleet=fleet or registered_fleet(), exclude_nodes=exclude_nodes)


def request_on_fleet(
    request: dict[str, Any], *, model: LlmModel, busy: Iterable[str], fleet: FleetSpec,
    exclude_nodes: tuple[Node, ...] = (),
) -> PlanRequest:
    """A stored request (plan_request_form.py) on ``fleet`` without ``busy`` and ``exclude_nodes``."""
    return plan_request_from_dict(
        request, fleet=fleet, profile=ModelProfile.from_dict(model.profile),
        exclude_nodes=tuple(n.name for n in exclude_nodes), exclude_devices=tuple(busy),
    )
