"""Exchanging the join token for a node credential (contracts §3 registration), over plain HTTP.

A refusal (bad, expired or revoked token; an invalid payload) is final: retrying cannot fix it and
the operator must act, so it raises ``RegistrationRefused`` with the server's message. Anything else
(server down, timeouts, 5xx, and 429: too many attempts from this address for now) is transient and
retried with backoff by ``register_until_done``.
"""

from __future__ import annotations

import logging
import random
import socket
import threading
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from contracts.hardware import DeviceSpec

log = logging.getLogger(__name__)

REGISTER_PATH = "/api/v1/agents/register/"


class RegistrationRefused(Exception):
    """The control plane refused to register this agent; the message is the server's."""


@dataclass(frozen=True)
class Registration:
    node_id: int
    node_credential: str
    incarnation: int
    queue: str
    broker_url: str
    broker_transport_options: dict[str, Any]
    heartbeat_interval_s: float

    @property
    def authorization(self) -> str:
        return f"Node {self.node_id}:{self.node_credential}"

    def __repr__(self) -> str:  # never log the credential
        return f"Registration(node_id={self.node_id}, incarnation={self.incarnation}, queue={self.queue!r})"


def register(*, server: str, join_token: str, name: str, address: str, devices: list[DeviceSpec],
             timeout_s: float = 10.0) -> Registration:
    payload = {
        "join_token": join_token,
        "name": name,
        "address": address,
        "emulated": any(device.emulated for device in devices),
        "devices": [asdict(device) for device in devices],
    }
    response = httpx.post(server.rstrip("/") + REGISTER_PATH, json=payload, timeout=timeout_s)
    if 400 <= response.status_code < 500 and response.status_code != 429:
        raise RegistrationRefused(f"{response.status_code}: {_error_message(response)}")
    response.raise_for_status()
    body = response.json()
    try:
        return Registration(
            node_id=int(body["node_id"]),
            node_credential=str(body["node_credential"]),
            incarnation=int(body["incarnation"]),
            queue=str(body["queue"]),
            broker_url=str(body["broker_url"]),
            broker_transport_options=dict(body.get("broker_transport_options") or {}),
            heartbeat_interval_s=float(body.get("heartbeat_interval_s") or 1.0),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise RegistrationRefused(f"unexpected registration response ({exc!r})") from None


def register_until_done(
    stop: threading.Event, max_backoff_s: float = 30.0, **kwargs: Any
) -> Registration | None:
    """``register``, retrying transient failures with exponential backoff; None once ``stop`` is set."""
    delay = 0.5
    while not stop.is_set():
        try:
            return register(**kwargs)
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: a non-JSON answer from a proxy
            log.warning("registration with %s failed (%s); retrying in %.1f s", kwargs["server"], exc, delay)
        stop.wait(delay * random.uniform(0.8, 1.2))
        delay = min(max_backoff_s, delay * 2)
    return None


def local_address(server: str) -> str:
    """The address of this host on the route to the server (no packet is sent)."""
    parts = urlsplit(server)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((parts.hostname or "127.0.0.1", parts.port or 80))
            return probe.getsockname()[0]
    except OSError:
        return socket.gethostname()


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    return str(body)[:500]
