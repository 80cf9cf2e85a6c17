"""``GET /api/v1/deployments/{id}/demand/``: a deployment's demand signals and attainment (demand.py).

Served by the gateway's app because the figures are the gateway's (its request records) and the
deployments app sits below it; the URL is the deployment's, where an operator looks for it.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.deployments.models import Deployment
from controlplane.deployments.targets import MAX_WINDOW_S, MIN_WINDOW_S
from controlplane.gateway.demand import deployment_demand


class DemandQuerySerializer(serializers.Serializer):
    window_s = serializers.IntegerField(min_value=MIN_WINDOW_S, max_value=MAX_WINDOW_S, required=False,
                                        help_text="Seconds back from now (default: its target_window_s).")


class DeploymentDemandView(APIView):
    @extend_schema(parameters=[DemandQuerySerializer], responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        """Arrival rate, prompt and output tokens per second, queue, KV use, and TTFT and TPOT against
        the deployment's targets over a window (docs/deployments.md, "Demand signals")."""
        query = DemandQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        deployment = get_object_or_404(Deployment, pk=pk)
        window_s = query.validated_data.get("window_s")
        return Response(deployment_demand(deployment=deployment, window_s=window_s))
