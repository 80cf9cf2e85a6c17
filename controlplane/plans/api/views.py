"""POST /api/v1/plans/ (preview, or store as a draft revision), POST /api/v1/plans/validate/ and
GET /api/v1/plans/calibration/.

Plans in responses carry, per stage, the calibration they were priced with and their raw figures
(``selectors.with_calibration``); a stored revision keeps the planner's JSON only."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.audit.services import audit_context, audit_record
from controlplane.common.permissions import ReadOnlyUnlessOperator, is_operator
from controlplane.deployments.plan_request_form import REQUEST_KEYS
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.selectors import plan_deploy_blockers
from controlplane.planning import PlanningError, PlanRequest, baseline_plan, plan, plan_to_dict, validate
from controlplane.plans.api.serializers import PlanRequestSerializer, PlanValidateSerializer
from controlplane.plans.selectors import calibration_overview, plan_request_from_inventory, with_calibration


def _planner_request(serializer) -> tuple[PlanRequest, dict[str, Any], dict[str, Any]]:
    """The validated body, its request in stored form, and the planner's request built from it."""
    serializer.is_valid(raise_exception=True)
    values = serializer.validated_data
    stored = {key: values[key] for key in REQUEST_KEYS}
    try:
        request = plan_request_from_inventory(model=values["model"], request=stored,
                                              deployment=values.get("deployment"))
        return request, stored, values
    except PlanningError as exc:
        raise ValidationError({"request": str(exc)}) from None


class PlanPreviewView(APIView):
    """Plan the model on the inventory as it is now. Nothing is deployed; with ``"save": true`` the
    plan is stored as a draft revision that a deployment can then be created from or apply.
    A what-if any signed-in user may ask; storing it is an operator's."""

    permission_classes = [IsAuthenticated]

    @extend_schema(
        request=PlanRequestSerializer, responses={200: OpenApiTypes.OBJECT, 201: OpenApiTypes.OBJECT}
    )
    def post(self, request: Request) -> Response:
        plan_request, stored, values = _planner_request(PlanRequestSerializer(data=request.data))
        if values["save"] and not is_operator(request.user):
            raise PermissionDenied(ReadOnlyUnlessOperator.message)
        try:
            result = (
                baseline_plan(plan_request, values["baseline"])
                if values.get("baseline")
                else plan(plan_request)
            )
        except PlanningError as exc:
            # Infeasible is an answer about the request, not a server fault: say why, with the shortfall.
            return Response(
                {"error": {"code": "infeasible", "message": str(exc), "details": {}}},
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        body = plan_to_dict(result)
        # The plan is made on every inventoried node; a deployment also needs agents, weights and
        # free devices. Say now what applying it would be refused for, not only at apply.
        blockers = {"deploy_blockers": plan_deploy_blockers(
            model=values["model"], plan_data=body, deployment=values.get("deployment")
        )}
        shown = with_calibration(result, fleet=plan_request.fleet)
        if not values["save"]:
            return Response({**shown, **blockers})
        with transaction.atomic():
            revision = plan_revision_create(
                model=values["model"],
                plan=body,
                request=stored,
                source="planner",
                deployment=values.get("deployment"),
            )
            audit_record(actor=audit_context(request), action="plan.saved", target=revision, detail={
                "model": values["model"].name, "deployment": revision.deployment_id,
                "predicted_decode_tokens_per_s": body.get("predicted", {}).get("decode_tokens_per_s"),
            })
        return Response({**shown, **blockers, "revision": revision.pk}, status=status.HTTP_201_CREATED)


class PlanValidateView(APIView):
    """Every problem of an edited plan, and its predicted figures next to the planner's own (a what-if:
    any signed-in user may ask)."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=PlanValidateSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        plan_request, _, values = _planner_request(PlanValidateSerializer(data=request.data))
        report = validate(values["plan"], plan_request)

        def priced(result):
            return with_calibration(result, fleet=plan_request.fleet) if result else None
        return Response(
            {
                "valid": not report.problems,
                "problems": [
                    {"code": p.code, "message": p.message, "replica": p.replica, "stage": p.stage}
                    for p in report.problems
                ],
                "predicted": priced(report.edited),
                "reference": priced(report.planned),
                "reference_error": report.planner_error,
            }
        )


class PlanCalibrationView(APIView):
    """What the planner's predictions are calibrated with, and how they compare with what runs."""

    @extend_schema(
        parameters=[OpenApiParameter("deployment", int, description="Only this deployment's stages.")],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """``{"devices": [{device, model, emulated, factor, by_bits, samples, source}], "stages": {stage
        key: {device, bits, batch, context, measured_ms, raw_ms, calibrated_ms, factor, samples, source,
        throttled, age_s}}}``: each device's factor (``source``: measured, model or kind for a device
        never measured, none) and each observed stage's decode step, measured and predicted at the
        load it ran (docs/planner.md, "Calibration")."""
        deployment = request.query_params.get("deployment")
        if deployment is not None and not deployment.isdigit():
            raise ValidationError({"deployment": "expected a deployment id"})
        return Response(calibration_overview(deployment_id=int(deployment) if deployment else None))
