"""The callers the authorization matrix tries on every route, each as the headers and session it sends.

A principal is built on a database of its own test: users (plain, operator, staff), an API key, two
registered nodes (their current credentials, and one node's credential of an earlier incarnation,
which re-registering revoked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from controlplane.common.permissions import OPERATORS_GROUP
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.gateway.accounts.services import api_key_create

DEVICE = {"model": "T4", "memory_bytes": 16 * 1024**3, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
          "bf16_tflops": 0.0, "int8_tops": 130.0, "emulated": True, "index": 0}
# The order of the matrix's columns.
NAMES = ("anonymous", "plain", "operator", "admin", "api_key", "node", "other_node", "revoked_node")


@dataclass
class Principal:
    name: str
    headers: dict[str, str] = field(default_factory=dict)  # Django test client keyword form (HTTP_…)
    user: object | None = None  # logged in by session
    raw: dict[str, str] = field(default_factory=dict)  # the same headers as an ASGI client sends them

    def client(self) -> Client:
        client = Client(**self.headers)
        if self.user is not None:
            client.force_login(self.user)
        return client

    def websocket_headers(self, origin: str) -> list[tuple[bytes, bytes]]:
        """What a websocket client of this principal sends: its headers, its session cookie, ``origin``."""
        headers = [(k.encode(), v.encode()) for k, v in self.raw.items()] + [(b"origin", origin.encode())]
        if self.user is not None:
            headers.append((b"cookie", f"sessionid={self.client().cookies['sessionid'].value}".encode()))
        return headers


def _authorization(value: str) -> dict:
    return {"headers": {"HTTP_AUTHORIZATION": value}, "raw": {"authorization": value}}


def _register(join_token: str, name: str):
    return agent_register(join_token=join_token, name=name, address="127.0.0.1", emulated=True,
                          devices=[DEVICE])


def principals_create() -> dict[str, Principal]:
    users = get_user_model().objects
    plain = users.create_user("matrix-plain")
    operator = users.create_user("matrix-operator")
    operator.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
    admin = users.create_user("matrix-admin", is_staff=True)
    _, key = api_key_create(user=plain, name="matrix")
    token = join_token_create(ttl=timedelta(hours=1), description="matrix").secret
    old = _register(token, "matrix-a")
    a = _register(token, "matrix-a")  # a new incarnation: ``old``'s credential is revoked
    b = _register(token, "matrix-b")
    return {
        "anonymous": Principal("anonymous"),
        "plain": Principal("plain", user=plain),
        "operator": Principal("operator", user=operator),
        "admin": Principal("admin", user=admin),
        "api_key": Principal("api_key", **_authorization(f"Bearer {key}")),
        "node": Principal("node", **_authorization(f"Node {a.node.pk}:{a.credential}")),
        "other_node": Principal("other_node", **_authorization(f"Node {a.node.pk}:{b.credential}")),
        "revoked_node": Principal("revoked_node", **_authorization(f"Node {old.node.pk}:{old.credential}")),
    }
