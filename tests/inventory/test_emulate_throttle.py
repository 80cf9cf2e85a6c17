"""``POST /api/v1/devices/{id}/emulate-throttle/``: an emulated card made to throttle through its agent.

Sends are recorded at ``send_task`` the way the deployments tests record them (RecordingApp): a task
is seen once the transaction that decided it commits, on the node's own queue, as JSON.
"""

from __future__ import annotations

import pytest
from django.db import transaction

from contracts.names import node_queue
from contracts.tasks import SET_THROTTLE
from controlplane.common import task_sending
from controlplane.inventory import services
from tests.api.factories import make_device, make_node
from tests.api.mixins import assert_error
from tests.deployments import conftest as deployments_tests

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(monkeypatch) -> deployments_tests.Sent:
    record = deployments_tests.Sent()
    monkeypatch.setattr(deployments_tests, "TASK_NAMES", deployments_tests.TASK_NAMES | {SET_THROTTLE})
    monkeypatch.setattr(task_sending, "celery_app", deployments_tests.RecordingApp(record))
    return record


def url(device) -> str:
    return f"/api/v1/devices/{device.pk}/emulate-throttle/"


def test_an_emulated_device_is_told_to_throttle_and_to_recover(api, sent):
    node = make_node(name="box", incarnation=2)
    make_device(node, emulated=True)
    card = make_device(node, emulated=True)
    response = api.post(url(card), {"factor": 0.5}, format="json")
    assert response.status_code == 202, response.content
    assert response.json() == {"device": "box/gpu1", "factor": 0.5, "queue": node_queue(node.pk)}
    assert sent.take() == [(node_queue(node.pk), SET_THROTTLE, {"device_index": 1, "factor": 0.5})]
    assert api.post(url(card), {"factor": 1}, format="json").status_code == 202
    assert sent.take() == [(node_queue(node.pk), SET_THROTTLE, {"device_index": 1, "factor": 1.0})]


@pytest.mark.parametrize("body, message", [
    ({"factor": 0}, "factor: must be greater than 0"),
    ({"factor": -0.5}, "factor:"),
    ({"factor": 1.5}, "factor:"),
    ({"factor": "half"}, "factor:"),
    ({}, "factor: This field is required"),
])
def test_a_factor_outside_0_1_is_refused_and_nothing_is_sent(api, sent, body, message):
    card = make_device(make_node(incarnation=1), emulated=True)
    assert_error(api.post(url(card), body, format="json"), 400, message)
    assert sent.take() == []


def test_only_an_emulated_device_of_a_registered_node_can_be_throttled(api, sent):
    real = make_device(make_node(name="gpu-host", incarnation=1), emulated=False)
    assert_error(api.post(url(real), {"factor": 0.5}, format="json"), 400,
                 "gpu-host/gpu0 is a real device: only an emulated device can be made to throttle")
    declared = make_device(make_node(name="no-agent"), emulated=True)
    assert_error(api.post(url(declared), {"factor": 0.5}, format="json"), 400,
                 "no agent has registered node no-agent")
    assert sent.take() == []


def test_a_refused_transaction_sends_nothing(sent):
    card = make_device(make_node(incarnation=1), emulated=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        services.device_emulate_throttle(device=card, factor=0.5)
        raise RuntimeError("rolled back")
    assert sent.take() == []


def test_anonymous_callers_are_refused(anonymous, sent):
    card = make_device(make_node(incarnation=1), emulated=True)
    assert anonymous.post(url(card), {"factor": 0.5}, format="json").status_code == 401
    assert sent.take() == []
