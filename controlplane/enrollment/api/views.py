"""Endpoints agents call: registration (join token in the body) and, afterwards, their own state."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.deployments.dispatch import node_queue
from controlplane.deployments.selectors import stages_wanted_on
from controlplane.enrollment.api import serializers
from controlplane.enrollment.authentication import IsNode, NodeCredentialAuthentication
from controlplane.enrollment.services import JoinTokenRefused, agent_register


class AgentRegisterView(APIView):
    """Exchange a join token for a node credential (contracts §3). No user session or token applies."""

    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(
        request=serializers.RegistrationSerializer, responses=serializers.RegistrationResultSerializer
    )
    def post(self, request):
        data = serializers.RegistrationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        try:
            registration = agent_register(**data.validated_data)
        except JoinTokenRefused as exc:
            raise PermissionDenied(f"join token refused: {exc}") from None
        result = {
            "node_id": registration.node.pk,
            "node_credential": registration.credential,
            "incarnation": registration.incarnation,
            "queue": node_queue(registration.node),
            "broker_url": settings.MOTLEY_AGENT_BROKER_URL,
            "broker_transport_options": settings.CELERY_BROKER_TRANSPORT_OPTIONS,
            "heartbeat_interval_s": settings.MOTLEY_AGENT_HEARTBEAT_INTERVAL_S,
        }
        return Response(serializers.RegistrationResultSerializer(result).data, status=status.HTTP_201_CREATED)


class AgentSelfView(APIView):
    """What the calling node should run: for an agent that restarted and reconciles its processes."""

    authentication_classes = [NodeCredentialAuthentication]
    permission_classes = [IsNode]

    @extend_schema(responses=serializers.AgentSelfSerializer)
    def get(self, request):
        principal = request.user
        stages = stages_wanted_on(node_id=principal.node.pk)
        wanted = [{"stage_key": s.stage_key, "spec": s.spec} for s in stages]
        body = {"node": principal.node, "incarnation": principal.incarnation, "wanted_stages": wanted}
        return Response(serializers.AgentSelfSerializer(body).data)
