"""POST /api/v1/plans/ (preview) and POST /api/v1/plans/validate/ (what-if of an edited plan)."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.plans.api.serializers import PlanRequestSerializer, PlanValidateSerializer
from controlplane.plans.selectors import plan_request_from_inventory
from controlplane.planning import PlanningError, baseline_plan, plan, plan_to_dict, validate


def _request_from(serializer) -> tuple:
    serializer.is_valid(raise_exception=True)
    options = dict(serializer.validated_data)
    options.pop("baseline", None)
    options.pop("plan", None)
    try:
        return plan_request_from_inventory(**options), serializer.validated_data
    except PlanningError as exc:
        raise ValidationError({"request": str(exc)}) from None


class PlanPreviewView(APIView):
    """Plan the model on the inventory as it is now; nothing is stored or deployed."""

    @extend_schema(request=PlanRequestSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        plan_request, options = _request_from(PlanRequestSerializer(data=request.data))
        try:
            result = baseline_plan(plan_request, options["baseline"]) if "baseline" in options else plan(plan_request)
        except PlanningError as exc:
            # Infeasible is an answer about the request, not a server fault: say why, with the shortfall.
            return Response(
                {"error": {"code": "infeasible", "message": str(exc), "details": {}}},
                status=status.HTTP_422_UNPROCESSABLE_ENTITY,
            )
        return Response(plan_to_dict(result))


class PlanValidateView(APIView):
    """Every problem of an edited plan, and its predicted figures next to the planner's own."""

    @extend_schema(request=PlanValidateSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        plan_request, options = _request_from(PlanValidateSerializer(data=request.data))
        report = validate(options["plan"], plan_request)
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
