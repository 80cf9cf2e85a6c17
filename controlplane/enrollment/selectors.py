"""Reads of enrollment: who is behind a node credential."""

from __future__ import annotations

import hmac

from controlplane.enrollment.models import NodeCredential
from controlplane.enrollment.services import secret_digest
from controlplane.inventory.models import Node


def node_for_credential(*, authorization: str) -> tuple[Node, int] | None:
    """The node and incarnation an ``Authorization: Node <id>:<credential>`` header proves, or None.

    The credential is bound to one node id: a valid credential of node B presented with node A's
    id matches nothing. Only the latest incarnation's credential exists, so an old one fails too.
    """
    scheme, _, value = authorization.strip().partition(" ")
    node_id, _, secret = value.strip().partition(":")
    if scheme != "Node" or not node_id.isdigit() or not secret:
        return None
    credential = NodeCredential.objects.select_related("node").filter(node_id=int(node_id)).first()
    if credential is None or not hmac.compare_digest(credential.digest, secret_digest(secret)):
        return None
    return credential.node, credential.incarnation
