"""Rebalance proposals: ``GET /api/v1/deployments/{id}/proposals/`` and
``POST /api/v1/rebalance-proposals/{id}/accept/`` and ``/dismiss/``.

Allowed to whoever may apply a plan to the deployment (the deployments API's permissions): accepting
is an apply, through the same service and checks.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.audit.services import audit_context
from controlplane.deployments.api.views import DeploymentViewSet
from controlplane.deployments.models import Deployment
from controlplane.rebalance import selectors, services
from controlplane.rebalance.api.serializers import RebalanceProposalSerializer
from controlplane.rebalance.models import RebalanceProposal

PERMISSIONS = DeploymentViewSet.permission_classes


class DeploymentProposalList(generics.ListAPIView):
    """The deployment's rebalance proposals, newest first; ``?status=open`` for the one to decide."""

    serializer_class = RebalanceProposalSerializer
    permission_classes = PERMISSIONS
    filter_backends = []

    @extend_schema(parameters=[OpenApiParameter("status", str, enum=RebalanceProposal.Status.values)])
    def get(self, request: Request, *args, **kwargs) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        deployment = get_object_or_404(Deployment, pk=self.kwargs["pk"])
        status = self.request.query_params.get("status")
        if status is not None and status not in RebalanceProposal.Status.values:
            raise ValidationError({"status": f"unknown status {status!r}; one of "
                                             f"{', '.join(RebalanceProposal.Status.values)}"})
        return selectors.proposals_of(deployment=deployment, status=status)


class _Decision(APIView):
    permission_classes = PERMISSIONS
    decide = None

    @extend_schema(request=None, responses=RebalanceProposalSerializer)
    def post(self, request: Request, pk: int) -> Response:
        proposal = get_object_or_404(RebalanceProposal, pk=pk)
        decided = type(self).decide(proposal=proposal, actor=audit_context(request))
        return Response(RebalanceProposalSerializer(decided, context={"request": request}).data)


class ProposalAccept(_Decision):
    """Apply the proposal's plan (as ``POST /api/v1/deployments/{id}/apply/`` would, audited
    ``plan.rebalanced``); refused, naming why, when it is not open or the deployment moved on."""

    decide = staticmethod(services.proposal_accept)


class ProposalDismiss(_Decision):
    """Close the proposal unapplied (audited ``rebalance_proposal.dismissed``)."""

    decide = staticmethod(services.proposal_dismiss)
