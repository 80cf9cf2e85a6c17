"""The Nodes page: status (observed) and intent (the operator's) apart, and the four node actions."""

from __future__ import annotations

import re

from django.contrib.staticfiles import finders
from django.urls import reverse

from controlplane.inventory.models import Node


def rows(body: str) -> dict[str, str]:
    """Each node's table row, by name."""
    return {m.group(1): m.group(0) for m in re.finditer(r'<tr data-node="([^"]+)".*?</tr>', body, re.S)}


def cells(row: str) -> tuple[str, str]:
    """The row's status and intent as shown."""
    status = re.search(r'class="status status-\w+"[^>]*>([\w ()]+)<', row).group(1)
    intent = re.search(r'class="intent intent-\w+"[^>]*>(\w+)<', row).group(1)
    return status, intent


def actions(row: str) -> list[str]:
    return re.findall(r'data-action="(\w+)"', row)


def test_the_page_shows_status_and_intent_apart_with_the_actions_each_intent_allows(
    operator_client, lab_fleet, django_assert_max_num_queries
):
    Node.objects.update(incarnation=1)  # registered by their agents
    Node.objects.filter(name="node-b").update(status=Node.Status.LOST, intent=Node.Intent.DRAINING)
    Node.objects.filter(name="node-c").update(intent=Node.Intent.CORDONED)
    with django_assert_max_num_queries(6):
        body = operator_client.get(reverse("dashboard:nodes")).content.decode()
    assert "<th>Status</th><th>Intent</th>" in body
    by_name = rows(body)
    a, b, c = by_name["node-a"], by_name["node-b"], by_name["node-c"]
    assert cells(a) == ("Ready", "Schedulable") and actions(a) == ["cordon", "drain"]
    assert cells(b) == ("Lost", "Draining") and actions(b) == ["undrain"]
    assert cells(c) == ("Ready", "Cordoned") and actions(c) == ["uncordon", "drain"]
    assert 'class="intent intent-draining"' in b and 'class="status status-lost"' in b
    node_b = Node.objects.get(name="node-b")
    assert f'data-action="undrain" data-node-id="{node_b.pk}" data-node-name="node-b"' in b
    assert 'id="node-confirm"' in body and "dashboard/nodes.js" in body  # confirmation, then the API


def test_a_node_no_agent_has_registered_is_declared_and_its_gpus_health_unknown(operator_client, lab_fleet):
    """Imported from a fleet file and never heard from: the planner refuses it, the page says why."""
    Node.objects.filter(name="node-a").update(incarnation=1)
    body = operator_client.get(reverse("dashboard:nodes")).content.decode()
    by_name = rows(body)
    assert cells(by_name["node-a"]) == ("Ready", "Schedulable")
    assert cells(by_name["node-b"]) == ("Declared (no agent)", "Schedulable")
    assert 'data-status="declared"' in by_name["node-b"] and "no agent has registered" in by_name["node-b"]
    devices = body.split('id="devices-table"', 1)[1]
    cell = r"<td>([\w/-]+)(?: <span[^>]*>emulated</span>)?</td>.*?class=\"status status-(\w+)\""
    health = dict(re.findall(cell, devices, re.S))
    assert health["node-a/gpu0"] == "healthy" and health["node-b/gpu0"] == health["node-c/gpu0"] == "unknown"
    assert ">Unknown<" in devices


def test_the_script_calls_the_node_action_endpoints(operator_client, lab_fleet):
    script = open(finders.find("dashboard/nodes.js")).read()
    assert "postJSON(`/api/v1/nodes/${chosen.nodeId}/${chosen.action}/`, {})" in script  # {}: CSRF header
    assert "showModal()" in script and 'dialog.returnValue !== "confirm"' in script
    node = Node.objects.get(name="node-a")
    for action in ("cordon", "uncordon", "drain", "undrain"):
        assert action in script
        assert reverse(f"node-{action}", kwargs={"pk": node.pk}) == f"/api/v1/nodes/{node.pk}/{action}/"
