"""The server-rendered pages: login required, the inventory drawn from the ORM, few queries."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from controlplane.gateway.traces.store import StoreExporter
from tests.support.trace_samples import request_trace

PAGES = ["dashboard:topology", "dashboard:fleet", "dashboard:utilization", "dashboard:nodes",
         "dashboard:models"]


@pytest.mark.parametrize("name", PAGES)
def test_pages_send_anonymous_users_to_the_login_page(client, db, name):
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=")


def test_login_page_is_the_dashboards_own(client, db):
    body = client.get("/accounts/login/").content.decode()
    assert "Log in to motley" in body and 'name="password"' in body


@pytest.mark.parametrize("name", PAGES)
def test_pages_render_for_an_operator(operator_client, lab_fleet, name):
    response = operator_client.get(reverse(name))
    assert response.status_code == 200


def test_nodes_page_lists_every_node_and_marks_emulated_devices(
    operator_client, lab_fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(6):
        body = operator_client.get(reverse("dashboard:nodes")).content.decode()
    for name in ("node-a", "node-b", "node-c", "node-a/gpu0", "A100-80GB-SXM", "RTX-A6000"):
        assert name in body
    assert body.count('class="badge emulated"') >= 3


def test_topology_embeds_nodes_devices_and_links_including_implied_nvlink(operator_client, lab_fleet):
    response = operator_client.get(reverse("dashboard:topology-json"))
    data = response.json()
    assert [n["name"] for n in data["nodes"]] == ["node-a", "node-b", "node-c"]
    a100 = data["nodes"][0]["devices"][0]
    assert (a100["model"], a100["memory_gib"], a100["emulated"]) == ("A100-80GB-SXM", 80.0, True)
    kinds = {(link["kind"], link["implied"]) for link in data["links"]}
    assert {("network", False), ("pcie", False), ("nvlink", True)} <= kinds
    page = operator_client.get(reverse("dashboard:topology")).content.decode()
    embedded = page.split('id="topology-data" type="application/json">')[1].split("</script>")[0]
    assert json.loads(embedded) == data


def test_topology_says_which_nodes_no_agent_has_registered(operator_client, lab_fleet):
    """The same word as the Nodes page and the API: declared, its GPUs' health unknown."""
    from controlplane.inventory.models import Node

    Node.objects.filter(name="node-a").update(incarnation=1)
    data = operator_client.get(reverse("dashboard:topology-json")).json()
    shown = {n["name"]: (n["status"], {d["health"] for d in n["devices"]}) for n in data["nodes"]}
    assert shown == {"node-a": ("ready", {"healthy"}), "node-b": ("declared", {"unknown"}),
                     "node-c": ("declared", {"unknown"})}


def test_topology_query_count_does_not_grow_with_the_fleet(
    operator_client, lab_fleet, django_assert_max_num_queries
):
    with django_assert_max_num_queries(7):
        operator_client.get(reverse("dashboard:topology-json"))


def test_plotly_is_served_locally(operator_client, db):
    from django.contrib.staticfiles import finders

    assert finders.find("vendor/plotly.min.js").endswith("plotly/package_data/plotly.min.js")
    page = operator_client.get(reverse("dashboard:utilization")).content.decode()
    # Nothing loaded from another host (a bare "cdn" also matched a random CSRF token once).
    assert '/static/vendor/plotly.min.js' in page and not re.search(r'(src|href)="(https?:)?//', page)


def test_the_traces_page_embeds_the_kept_traces_and_says_when_none_are_kept(
        operator_client, monkeypatch, django_assert_max_num_queries):
    sample = request_trace()
    StoreExporter().export(sample.gateway + sample.stage)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    with django_assert_max_num_queries(5):  # the session's, the traces' groups, their spans
        body = operator_client.get(reverse("dashboard:traces")).content.decode()
    (listed,) = json.loads(re.search(r'id="traces-data"[^>]*>(.*?)</script>', body, re.S)[1])
    assert (listed["trace_id"], listed["spans"]) == (sample.trace_id, 4)
    assert 'id="tracing-off"' in body  # otlp alone: this control plane keeps none
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,motley")
    assert 'id="tracing-off"' not in operator_client.get(reverse("dashboard:traces")).content.decode()
    deployments = operator_client.get(reverse("dashboard:deployments")).content.decode()
    assert f'href="{reverse("dashboard:traces")}"' in deployments  # reached from the Deployments page
