"""A device's health: observed from its agent's samples, overridden by an operator, used by the planner.

Intent and observation are separate fields: a sample never changes ``health_override`` and an
operator's override never changes ``observed_health``; ``health`` is the override else the observation.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controlplane.asgi import application
from controlplane.enrollment.services import agent_register, join_token_create
from controlplane.inventory import health
from controlplane.inventory.health import DeviceHealthWatch, device_health_observe, observed_health
from controlplane.inventory.models import Device
from controlplane.inventory.selectors import fleet_spec_from_inventory
from tests.api.factories import make_device, make_node
from tests.deployments.conftest import sent  # noqa: F401  (autouse: registrations reach no broker)

HEALTHY, DEGRADED, UNHEALTHY = Device.Health.HEALTHY, Device.Health.DEGRADED, Device.Health.UNHEALTHY
T4 = {"model": "T4", "memory_bytes": 16 * 1024**3, "memory_bandwidth_gbs": 320.0, "fp16_tflops": 65.0,
      "bf16_tflops": 0.0, "int8_tops": 130.0, "emulated": True}


def sample(index: int = 0, **fields) -> dict:
    """One GpuMetrics as an agent sends it, with the fields a test cares about."""
    return {"index": index, "utilization_pct": 50.0, "throttle_reasons": [], **fields}


@pytest.mark.parametrize("fields, throttled_for, expected", [
    ({}, None, (HEALTHY, "")),
    ({"xid_errors": 2}, None, (UNHEALTHY, "2 critical XID error(s) since the agent started")),
    ({"ecc_errors": 1, "xid_errors": 0}, None,
     (UNHEALTHY, "1 uncorrected ECC error(s) since the last reset")),
    ({"retired_pages": 4}, None, (DEGRADED, "4 memory page(s) retired or row(s) remapped")),
    ({"throttle_reasons": ["sw_thermal"]}, 12.0, (DEGRADED, "throttled (sw_thermal) for over 10 s")),
    ({"throttle_reasons": ["sw_thermal"]}, 3.0, (HEALTHY, "")),  # not sustained yet
    ({"xid_errors": None, "ecc_errors": None, "retired_pages": None}, None, (HEALTHY, "")),  # not reported
])
def test_the_observation_of_one_sample(fields, throttled_for, expected):
    assert observed_health(sample(**fields), throttled_for_s=throttled_for, sustained_s=10) == expected


def test_a_power_capped_card_is_working_as_designed():
    watch = DeviceHealthWatch(1, clock=lambda: 0.0, sustained_s=0)
    assert watch.changes([sample(throttle_reasons=["power_cap"])]) == {0: (HEALTHY, "")}


def test_the_watch_reports_only_changes_and_a_throttle_once_it_is_sustained():
    now = [0.0]
    watch = DeviceHealthWatch(1, clock=lambda: now[0], sustained_s=10)
    hot = [sample(0, throttle_reasons=["sw_thermal"]), sample(1)]
    assert watch.changes(hot) == {0: (HEALTHY, ""), 1: (HEALTHY, "")}  # the connection's first: all
    watch._written.update(watch.changes(hot))
    for _ in range(9):
        now[0] += 1
        assert watch.changes(hot) == {}
    now[0] += 1
    assert watch.changes(hot) == {0: (DEGRADED, "throttled (sw_thermal) for over 10 s")}
    watch._written.update(watch.changes(hot))
    now[0] += 5
    assert watch.changes(hot) == {}  # the same observation: nothing to write, however long it lasts
    assert watch.changes([sample(0), sample(1)]) == {0: (HEALTHY, "")}  # cooled down


@pytest.mark.django_db
def test_observing_writes_only_what_changed_and_never_the_override():
    node = make_node(name="n")
    a, b = make_device(node), make_device(node, health_override=HEALTHY)
    with CaptureQueriesContext(connection) as queries:
        assert device_health_observe(node_id=node.pk, observed={0: (HEALTHY, ""), 1: (HEALTHY, "")}) == []
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    changed = device_health_observe(node_id=node.pk, observed={0: (UNHEALTHY, "xid"), 1: (UNHEALTHY, "ecc")})
    assert sorted(d.index for d in changed) == [0, 1]
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.observed_health, a.health_reason, a.health) == (UNHEALTHY, "xid", UNHEALTHY)
    assert a.health_override is None
    assert (b.observed_health, b.health, b.health_override) == (UNHEALTHY, HEALTHY, HEALTHY)  # operator wins


@pytest.mark.django_db
def test_the_planner_keeps_off_the_effective_unhealthy(api):
    node = make_node(name="n")
    observed_bad, overridden_bad = make_device(node), make_device(node)
    device_health_observe(node_id=node.pk, observed={0: (UNHEALTHY, "2 critical XID error(s)")})
    url = f"/api/v1/devices/{overridden_bad.pk}/"
    response = api.patch(url, {"health_override": "unhealthy"}, format="json")
    assert response.status_code == 200 and response.json()["health"] == "unhealthy"
    assert response.json()["observed_health"] == "healthy"  # the operator's word changes no observation
    assert [d.down for d in fleet_spec_from_inventory().devices] == [True, True]
    api.patch(f"/api/v1/devices/{observed_bad.pk}/", {"health_override": "healthy"}, format="json")
    api.patch(f"/api/v1/devices/{overridden_bad.pk}/", {"health_override": None}, format="json")
    assert [d.down for d in fleet_spec_from_inventory().devices] == [False, False]
    body = api.get(f"/api/v1/devices/{observed_bad.pk}/").json()
    assert (body["health"], body["observed_health"], body["health_reason"], body["health_override"]) == (
        "healthy", "unhealthy", "2 critical XID error(s)", "healthy")
    device_health_observe(node_id=node.pk, observed={0: (HEALTHY, "")})  # recovered: the override stays
    assert Device.objects.get(pk=observed_bad.pk).health_override == HEALTHY


@pytest.mark.django_db
def test_health_itself_is_derived_and_the_api_says_what_to_set(api):
    device = make_device()
    response = api.patch(f"/api/v1/devices/{device.pk}/", {"health": "unhealthy"}, format="json")
    assert response.status_code == 400 and "set health_override" in response.json()["error"]["message"]
    assert api.patch(f"/api/v1/devices/{device.pk}/", {"health": "healthy"}, format="json").status_code == 200
    bad = api.patch(f"/api/v1/devices/{device.pk}/", {"health_override": "broken"}, format="json")
    assert bad.status_code == 400 and "health_override" in bad.json()["error"]["message"]
    assert Device.objects.get(pk=device.pk).health == HEALTHY


@pytest.mark.django_db(transaction=True)
async def test_heartbeats_through_the_agents_socket_observe_health_cheaply(monkeypatch):
    """Ten heartbeats of the same health: one database call; an XID error: one more, and the device is
    unhealthy (the planner's down); the operator's healthy override holds while heartbeats go on."""
    secret = (await database_sync_to_async(join_token_create)(ttl=timedelta(hours=1))).secret
    registered = await database_sync_to_async(agent_register)(
        join_token=secret, name="node-h", address="127.0.0.1", emulated=True, devices=[T4, T4])
    calls = []
    real = health.device_health_observe
    monkeypatch.setattr(health, "device_health_observe", lambda **kw: calls.append(kw) or real(**kw))
    communicator = WebsocketCommunicator(application, "/ws/agents/", headers=[
        (b"authorization", f"Node {registered.node.pk}:{registered.credential}".encode())])
    assert (await communicator.connect())[0]

    async def beat(devices):
        await communicator.send_json_to({"type": "heartbeat", "incarnation": registered.incarnation, "seq": 1,
                                         "sent_at": 0.0, "devices": devices, "stages": []})
        assert await communicator.receive_nothing(0.05)

    for _ in range(10):
        await beat([sample(0, xid_errors=0), sample(1, xid_errors=0)])
    assert len(calls) == 1
    await beat([sample(0, xid_errors=1), sample(1, xid_errors=0)])
    xid = (UNHEALTHY, "1 critical XID error(s) since the agent started")
    assert [c["observed"] for c in calls[1:]] == [{0: xid}]

    def state():
        devices = Device.objects.filter(node=registered.node).order_by("index")
        return [(d.health, d.observed_health) for d in devices]

    assert await database_sync_to_async(state)() == [(UNHEALTHY, UNHEALTHY), (HEALTHY, HEALTHY)]
    spec = await database_sync_to_async(fleet_spec_from_inventory)()
    assert [d.down for d in spec.devices] == [True, False]
    await database_sync_to_async(_override)(registered.node, 0, HEALTHY)  # the operator: "it is fine"
    for _ in range(3):
        await beat([sample(0, xid_errors=1), sample(1, xid_errors=0)])
    assert len(calls) == 2
    assert await database_sync_to_async(state)() == [(HEALTHY, UNHEALTHY), (HEALTHY, HEALTHY)]
    await communicator.disconnect()


def _override(node, index: int, override: str) -> None:
    device = Device.objects.get(node=node, index=index)
    device.health_override = override
    device.save(update_fields=["health_override"])
