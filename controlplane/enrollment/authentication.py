"""DRF authentication by node credential, for the endpoints an agent calls after registering."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import authentication, exceptions, permissions

from controlplane.enrollment.selectors import node_for_credential
from controlplane.inventory.models import Node


@dataclass(frozen=True)
class NodePrincipal:
    """``request.user`` of a request made by an agent: it is a node, never a person."""

    node: Node
    incarnation: int
    is_authenticated: bool = True
    is_staff: bool = False
    is_superuser: bool = False

    def __str__(self) -> str:
        return f"node {self.node.name}"


class NodeCredentialAuthentication(authentication.BaseAuthentication):
    """``Authorization: Node <node_id>:<credential>``; other schemes are left to the next class."""

    keyword = "Node"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin1")
        if not header.startswith(f"{self.keyword} "):
            return None
        found = node_for_credential(authorization=header)
        if found is None:
            raise exceptions.AuthenticationFailed("invalid node credential (re-register the agent)")
        node, incarnation = found
        return NodePrincipal(node=node, incarnation=incarnation), None

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsNode(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.user, NodePrincipal)
