"""Deployments API: list/get, create from a plan, apply a new plan revision, stop (node actions: nodes.py)."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.audit.services import audit_context
from controlplane.deployments import selectors, services
from controlplane.deployments.api import serializers
from controlplane.deployments.models import Deployment, PlanRevision
from controlplane.deployments.revisions import plan_revision_create
from controlplane.deployments.targets import TARGET_FIELDS


def _revision_from(data: dict, *, model, deployment=None) -> PlanRevision:
    if "revision" in data:
        return data["revision"]
    return plan_revision_create(
        model=model, plan=data["plan"], request=data["request"], source=data["source"], deployment=deployment
    )


class DeploymentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = selectors.deployment_list()
    serializer_class = serializers.DeploymentSerializer
    filterset_fields = ["status", "model"]
    ordering_fields = ["name", "status", "created"]

    @extend_schema(
        request=serializers.DeploymentCreateSerializer, responses={201: serializers.DeploymentSerializer}
    )
    def create(self, request):
        data = serializers.DeploymentCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        with transaction.atomic():  # a refused deployment leaves no draft behind
            revision = _revision_from(values, model=values.get("model"))
            deployment = services.deployment_create(
                name=values["name"], revision=revision, replan_on_failure=values["replan_on_failure"],
                routing_strategy=values["routing_strategy"], prefix_caching=values["prefix_caching"],
                speculation=values["speculation"], speculative_tokens=values["speculative_tokens"],
                draft_model=values["draft_model"], targets=data.targets(), created_by=request.user,
                actor=audit_context(request),
            )
        return Response(self._detail(deployment), status=status.HTTP_201_CREATED)

    @extend_schema(request=serializers.DeploymentUpdateSerializer, responses=serializers.DeploymentSerializer)
    def partial_update(self, request, pk=None):
        """Change the routing strategy, replan_on_failure, the rebalance policy, a serving switch
        (prefix_caching, speculation, speculative_tokens: sent to the running stages) or the service-level
        targets; a new plan goes through apply."""
        data = serializers.DeploymentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = {k: v for k, v in data.validated_data.items() if k not in TARGET_FIELDS}
        deployment = services.deployment_update(
            deployment=self.get_object(), targets=data.targets(), actor=audit_context(request), **values
        )
        return Response(self._detail(deployment))

    @extend_schema(request=serializers.PlanInputSerializer, responses=serializers.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Make a plan revision the desired state; only stages whose spec changes restart."""
        deployment = self.get_object()
        data = serializers.PlanInputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            revision = _revision_from(data.validated_data, model=deployment.model, deployment=deployment)
            services.deployment_apply(deployment=deployment, revision=revision, actor=audit_context(request))
        return Response(self._detail(deployment))

    @extend_schema(request=None, responses=serializers.DeploymentSerializer)
    @action(detail=True, methods=["post"])
    def stop(self, request, pk=None):
        deployment = services.deployment_stop(deployment=self.get_object(), actor=audit_context(request))
        return Response(self._detail(deployment))

    @extend_schema(responses=serializers.PlanRevisionSerializer(many=True))
    @action(detail=True, methods=["get"])
    def revisions(self, request, pk=None):
        deployment = self.get_object()
        revisions = deployment.revisions.order_by("-number")
        return Response(serializers.PlanRevisionSerializer(revisions, many=True).data)

    def _detail(self, deployment: Deployment) -> dict:
        return self.get_serializer(selectors.deployment_list().get(pk=deployment.pk)).data
