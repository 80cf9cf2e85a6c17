"""Node actions: ``POST /api/v1/nodes/{id}/cordon/``, ``/uncordon/``, ``/drain/``, ``/undrain/``.

Thin interfaces to ``node_actions`` (what each does and refuses: its docstring, docs/deployments.md,
"Node intent"). Each answers ``{"node", "changed", "deployments"}``: the node as the nodes API shows
it, whether anything changed (a repeated action changes nothing), and the deployments a drain moved.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db.models import Count
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers as drf
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.audit.services import audit_context
from controlplane.deployments import node_actions, selectors
from controlplane.deployments.api.serializers import DeploymentSerializer
from controlplane.inventory.api.serializers import NodeSerializer
from controlplane.inventory.models import Node

NodeActionResponse = inline_serializer("NodeActionResponse", {
    "node": NodeSerializer(),
    "changed": drf.BooleanField(help_text="false when the node already was as asked: nothing was done"),
    "deployments": DeploymentSerializer(many=True, help_text="the deployments a drain re-planned off it"),
})


class _NodeActionView(APIView):
    node_action: Callable[..., node_actions.NodeActionResult]  # not "action": DRF and the schema read that

    @extend_schema(request=None, responses={200: NodeActionResponse})
    def post(self, request: Request, pk: int) -> Response:
        node = get_object_or_404(Node, pk=pk)
        result = type(self).node_action(node=node, actor=audit_context(request))
        context = {"request": request}
        node = Node.objects.annotate(device_count=Count("devices")).get(pk=result.node.pk)
        moved = selectors.deployment_list().filter(pk__in=[d.pk for d in result.deployments])
        return Response({"node": NodeSerializer(node, context=context).data, "changed": result.changed,
                         "deployments": DeploymentSerializer(moved, many=True, context=context).data})


class NodeCordonView(_NodeActionView):
    """Keep new stages off a node; the stages running there stay."""

    node_action = staticmethod(node_actions.node_cordon)


class NodeUncordonView(_NodeActionView):
    """Let a cordoned node take new stages again."""

    node_action = staticmethod(node_actions.node_uncordon)


class NodeDrainView(_NodeActionView):
    """Move every stage off a node (re-planning its deployments without it) and keep it empty."""

    node_action = staticmethod(node_actions.node_drain)


class NodeUndrainView(_NodeActionView):
    """Let a draining node take new stages again; nothing moves back by itself."""

    node_action = staticmethod(node_actions.node_undrain)
