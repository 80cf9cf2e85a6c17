"""The endpoint agents call over HTTP: registration (join token in the body). Everything after it
(heartbeats, stage events, refusals) goes over the agents' websocket (``consumers.py``); the work
comes as Celery tasks on the node's queue."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied, Throttled
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from contracts.names import node_queue
from controlplane.common.client_address import client_address
from controlplane.enrollment.api import serializers
from controlplane.enrollment.api.throttles import RegistrationThrottle
from controlplane.enrollment.services import JoinTokenRefused, agent_register


class AgentRegisterView(APIView):
    """Exchange a join token for a node credential (contracts §3). No user session or token applies."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [RegistrationThrottle]

    def throttled(self, request, wait):
        limit = settings.MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE
        raise Throttled(wait, detail=(
            f"too many registration attempts from {client_address(request)}: at most "
            f"{limit} a minute (MOTLEY_AGENT_REGISTRATIONS_PER_MINUTE)."))

    @extend_schema(
        request=serializers.RegistrationSerializer, responses=serializers.RegistrationResultSerializer
    )
    def post(self, request):
        data = serializers.RegistrationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            registration = agent_register(**data.validated_data, remote_addr=client_address(request))
        except JoinTokenRefused as exc:
            raise PermissionDenied(f"join token refused: {exc}") from None
        result = {
            "node_id": registration.node.pk,
            "node_credential": registration.credential,
            "incarnation": registration.incarnation,
            "queue": node_queue(registration.node.pk),
            "broker_url": settings.MOTLEY_AGENT_BROKER_URL,
            "broker_transport_options": settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            "heartbeat_interval_s": settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S,
        }
        return Response(serializers.RegistrationResultSerializer(result).data, status=status.HTTP_201_CREATED)

