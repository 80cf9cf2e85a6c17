"""POST /api/v1/plans/ (preview, or store as a draft revision) and POST /api/v1/plans/validate/."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.deployments.plan_request_form import REQUEST_KEYS
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.selectors import plan_deploy_blockers
from controlplane.planning import PlanningError, PlanRequest, baseline_plan, plan, plan_to_dict, validate
from controlplane.plans.api.serializers import PlanRequestSerializer, PlanValidateSerializer
from controlplane.plans.selectors import plan_request_from_inventory


def _planner_request(serializer) -> tuple[PlanRequest, dict[str, Any], dict[str, Any]]:
    """The validated body, its request in stored form, and the planner's request built from it."""
    serializer.is_valid(raise_exception=True)
    values = serializer.validated_data
    stored = {key: values[key] for key in REQUEST_KEYS}
    try:
        return plan_request_from_inventory(model=values["model"], request=stored), stored, values
    except PlanningError as exc:
        raise ValidationError({"request": str(exc)}) from None


class PlanPreviewView(APIView):
    """Plan the model on the inventory as it is now. Nothing is deployed; with ``"save": true`` the
    plan is stored as a draft revision that a deployment can then be created from or apply."""

    @extend_schema(
        request=PlanRequestSerializer, responses={200: OpenApiTypes.OBJECT, 201: OpenApiTypes.OBJECT}
    )
    def post(self, request: Request) -> Response:
        plan_request, stored, values = _planner_request(PlanRequestSerializer(data=request.data))
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
        if not values["save"]:
            return Response({**body, **blockers})
        revision = plan_revision_create(
            model=values["model"],
            plan=body,
            request=stored,
            source="planner",
            deployment=values.get("deployment"),
        )
        return Response({**body, **blockers, "revision": revision.pk}, status=status.HTTP_201_CREATED)


class PlanValidateView(APIView):
    """Every problem of an edited plan, and its predicted figures next to the planner's own."""

    @extend_schema(request=PlanValidateSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        plan_request, _, values = _planner_request(PlanValidateSerializer(data=request.data))
        report = validate(values["plan"], plan_request)
        return Response(
            {
                "valid": not report.problems,
                "problems": [
                    {"code": p.code, "message": p.message, "replica": p.replica, "stage": p.stage}
                    for p in report.problems
                ],
                "predicted": plan_to_dict(report.edited) if report.edited else None,
                "reference": plan_to_dict(report.planned) if report.planned else None,
                "reference_error": report.planner_error,
            }
        )
