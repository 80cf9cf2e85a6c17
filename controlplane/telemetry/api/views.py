"""``GET /api/v1/telemetry/``: every node's latest sample, with its age, from the cache all processes share.

What scripts and operators read of live telemetry (the dashboard's socket carries the same samples to
browsers); whichever server process answers, it reads the samples every process keeps
(``telemetry.selectors``).
"""

from __future__ import annotations

import time

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.telemetry.selectors import latest_samples, node_sample


class LatestTelemetryView(APIView):
    @extend_schema(
        parameters=[OpenApiParameter("node", str, description="Only this node's sample.")],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request: Request) -> Response:
        """``{"at", "stale_after_s", "nodes": [sample + "age_s", "stale"]}``: each node's latest heartbeat
        sample (``telemetry.selectors`` states the shape) within ``MOTLEY_TELEMETRY_SAMPLE_TTL_S``."""
        now = time.time()
        if name := request.query_params.get("node"):
            samples = [reading.value for reading in [node_sample(name)] if reading is not None]
        else:
            samples = latest_samples()
        stale_after = settings.MOTLEY_TELEMETRY_STALE_AFTER_S
        nodes = []
        for sample in samples:
            age = max(0.0, now - sample["received_at"])
            nodes.append({**sample, "age_s": round(age, 3), "stale": age > stale_after})
        return Response({"at": now, "stale_after_s": stale_after, "nodes": nodes})
