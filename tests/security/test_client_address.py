"""The client's address behind a load balancer: ``X-Forwarded-For`` counts only from a peer in
MOTLEY_TRUSTED_PROXIES, read from the right, so a client cannot name an address of its choosing; and
every place that records or checks the address (audit trail, /metrics, registration) uses that rule."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory

from controlplane.audit.models import AuditEntry
from controlplane.common.client_address import client_address
from controlplane.enrollment.services import join_token_create
from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)
from tests.deployments.conftest import TINY_CONFIG

BALANCER = "10.9.0.2"


def address(settings, trusted, peer, forwarded=None):
    settings.MOTLEY_TRUSTED_PROXIES = trusted
    extra = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_address(RequestFactory().get("/", **extra))


@pytest.mark.parametrize(("trusted", "peer", "forwarded", "expected"), [
    ((), "203.0.113.5", None, "203.0.113.5"),
    ((), BALANCER, "198.51.100.7", BALANCER),  # no proxy trusted: the header is ignored
    (("10.9.0.0/16",), "203.0.113.5", "198.51.100.7", "203.0.113.5"),  # a peer not trusted: ignored
    (("10.9.0.0/16",), BALANCER, "198.51.100.7", "198.51.100.7"),
    (("10.9.0.0/16",), BALANCER, "1.2.3.4, 198.51.100.7", "198.51.100.7"),  # the client's own claim
    (("10.9.0.0/16",), BALANCER, "198.51.100.7, 10.9.0.3", "198.51.100.7"),  # two trusted hops
    (("10.9.0.0/16",), BALANCER, "10.9.0.4, 10.9.0.3", "10.9.0.4"),  # all trusted: the farthest
    (("10.9.0.0/16",), BALANCER, "forged, 10.9.0.3", "10.9.0.3"),  # malformed: the last trusted hop
    (("10.9.0.0/16",), BALANCER, "", BALANCER),
    (("10.9.0.0/16",), f"::ffff:{BALANCER}", "2001:db8::1", "2001:db8::1"),  # IPv4-mapped peer
    (("10.9.0.0/16",), "/run/daphne.sock", "198.51.100.7", None),  # no IP peer: no address
    (("localhost",), "127.0.0.1", "198.51.100.7", "198.51.100.7"),  # a host name: its addresses
])
def test_forwarded_for_counts_only_from_a_trusted_peer(settings, trusted, peer, forwarded, expected):
    assert address(settings, trusted, peer, forwarded) == expected


@pytest.mark.parametrize("entry", ["10.9.0.0/33", "no-such-host.invalid"])
def test_a_malformed_trusted_network_names_the_setting(settings, entry):
    with pytest.raises(ImproperlyConfigured, match=f"MOTLEY_TRUSTED_PROXIES: .*{entry[:8]}"):
        address(settings, (entry,), BALANCER, "198.51.100.7")


@pytest.mark.django_db
def test_the_audit_trail_records_the_client_behind_the_balancer(api, anonymous, settings):
    settings.MOTLEY_TRUSTED_PROXIES = ("10.9.0.0/16",)
    forwarded = {"REMOTE_ADDR": BALANCER, "HTTP_X_FORWARDED_FOR": "1.2.3.4, 198.51.100.7"}
    created = api.post("/api/v1/models/", {"config": TINY_CONFIG, "name": "behind"}, format="json",
                       **forwarded)
    assert created.status_code == 201, created.content
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    body = {"join_token": secret, "name": "n7", "address": "10.9.0.7", "emulated": True, "devices": []}
    assert anonymous.post("/api/v1/agents/register/", body, format="json", **forwarded).status_code == 201
    entries = AuditEntry.objects.filter(action__in=["model.registered", "node.registered"])
    assert sorted(e.action for e in entries) == ["model.registered", "node.registered"]
    assert {e.remote_addr for e in entries} == {"198.51.100.7"}


@pytest.mark.django_db
def test_metrics_allow_list_sees_the_forwarded_client(client, settings):
    settings.MOTLEY_METRICS_TOKEN, settings.MOTLEY_METRICS_ALLOW = "", ("127.0.0.1/8",)
    settings.MOTLEY_TRUSTED_PROXIES = ("10.9.0.0/16",)

    def status(peer, forwarded):
        return client.get("/metrics", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=forwarded).status_code

    assert (status(BALANCER, "127.0.0.1"), status(BALANCER, "198.51.100.7")) == (200, 403)
    settings.MOTLEY_TRUSTED_PROXIES = ()
    assert status("198.51.100.7", "127.0.0.1") == 403
