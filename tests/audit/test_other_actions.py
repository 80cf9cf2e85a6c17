"""Models, API keys, join tokens, agents and devices: each action records one entry naming its actor
(a token or session user, the command line, the admin, an agent) and target; refused ones nothing."""

from __future__ import annotations

import getpass
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from controlplane.audit.models import AuditEntry
from controlplane.deployments.services import deployment_create
from controlplane.enrollment.models import JoinToken
from controlplane.enrollment.services import join_token_create
from controlplane.gateway.models import ApiKey
from controlplane.models_catalog.models import LlmModel
from tests.api.factories import make_device, make_node
from tests.api.mixins import assert_error
from tests.deployments.conftest import REQUEST, TINY_CONFIG

pytestmark = pytest.mark.django_db
CLI = f"cli:{getpass.getuser()}"


def entries() -> list[tuple[str, str, str, str]]:
    return [(e.action, e.actor_label, e.via, e.target_label) for e in AuditEntry.objects.order_by("id")]


@pytest.fixture
def checkpoint(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_CONFIG))
    return tmp_path / "tiny"


def test_model_registered_through_the_api_and_the_command(api, user, checkpoint):
    response = api.post("/api/v1/models/", {"path": str(checkpoint)}, format="json", REMOTE_ADDR="10.2.0.1")
    assert response.status_code == 201, response.content
    call_command("register_model", str(checkpoint), stdout=io.StringIO())  # the same again: a refresh
    model = LlmModel.objects.get()
    assert entries() == [("model.registered", "alice", "token", "tiny"),
                         ("model.registered", CLI, "cli", "tiny")]
    api_entry, cli_entry = AuditEntry.objects.order_by("id")
    assert (api_entry.actor, api_entry.remote_addr, api_entry.target_type) == (user, "10.2.0.1", "model")
    assert api_entry.target_id == str(model.pk) and not api_entry.detail["refreshed"]
    assert cli_entry.actor is None and cli_entry.remote_addr is None and cli_entry.detail["refreshed"]


def test_a_refused_registration_records_nothing(api, checkpoint):
    config = dict(TINY_CONFIG, model_type="gpt2")
    assert_error(api.post("/api/v1/models/", {"config": config, "name": "g"}, format="json"), 400, "gpt2")
    with pytest.raises(CommandError):
        call_command("register_model", str(checkpoint / "missing"), stdout=io.StringIO())
    assert entries() == []


def test_unregistering_is_recorded_and_a_protected_model_records_nothing(api, nodes, llm, revision):
    AuditEntry.objects.all().delete()
    deployment_create(name="tiny", revision=revision)
    AuditEntry.objects.all().delete()
    assert_error(api.delete(f"/api/v1/models/{llm.pk}/"), 409, "deployment")
    assert entries() == []
    free = api.post("/api/v1/models/", {"config": TINY_CONFIG, "name": "spare"}, format="json").json()
    assert api.delete(f"/api/v1/models/{free['id']}/").status_code == 204
    assert entries() == [("model.registered", "alice", "token", "spare"),
                         ("model.unregistered", "alice", "token", "spare")]


def test_api_key_created_by_the_command_and_revoked_in_the_admin(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", password=None)
    call_command("create_api_key", "root", "--name", "ci", stdout=io.StringIO())
    api_key = ApiKey.objects.get()
    client.force_login(root)
    changelist = reverse("admin:gateway_apikey_changelist")
    response = client.post(changelist, {"action": "revoke", "_selected_action": [api_key.pk]},
                           REMOTE_ADDR="10.3.0.1")
    assert response.status_code == 302
    client.post(changelist, {"action": "revoke", "_selected_action": [api_key.pk]})  # again: no change
    label = str(api_key)
    assert entries() == [("api_key.created", CLI, "cli", label), ("api_key.revoked", "root", "admin", label)]
    created, revoked = AuditEntry.objects.order_by("id")
    assert created.detail == {"user": "root", "name": "ci", "prefix": api_key.prefix}
    assert revoked.actor == root and revoked.remote_addr == "10.3.0.1" and revoked.target_type == "api_key"
    assert api_key.prefix in label
    assert not any(api_key.key_hash in str(e.detail) for e in AuditEntry.objects.all())


def test_join_token_issued_and_revoked_by_the_commands():
    out = io.StringIO()
    call_command("create_join_token", "--ttl", "1h", "--description", "rack 2", stdout=out,
                 stderr=io.StringIO())
    secret = out.getvalue().strip()
    token = JoinToken.objects.get()
    call_command("revoke_join_token", str(token.pk), stdout=io.StringIO())
    call_command("revoke_join_token", str(token.pk), stdout=io.StringIO())  # again: no change
    assert [(a, who, via) for a, who, via, _ in entries()] == [
        ("join_token.issued", CLI, "cli"), ("join_token.revoked", CLI, "cli")]
    issued = AuditEntry.objects.order_by("id").first()
    assert issued.detail["description"] == "rack 2" and issued.target_id == str(token.pk)
    assert secret not in json.dumps([e.detail for e in AuditEntry.objects.all()])
    with pytest.raises(CommandError):
        call_command("create_join_token", "--ttl", "0", stdout=io.StringIO(), stderr=io.StringIO())
    assert AuditEntry.objects.count() == 2


def test_an_agent_registering_is_recorded_with_its_address(anonymous):
    secret = join_token_create(ttl=timedelta(hours=1)).secret
    AuditEntry.objects.all().delete()
    body = {"join_token": secret, "name": "n7", "address": "10.9.0.7", "emulated": True, "devices": []}
    url = "/api/v1/agents/register/"
    assert anonymous.post(url, body, format="json", REMOTE_ADDR="10.9.0.7").status_code == 201
    refused = anonymous.post(url, {**body, "join_token": "mjt_wrong"}, format="json")
    assert_error(refused, 403, "unknown join token")
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.actor_label) == ("node.registered", None, "agent n7")
    assert entry.via == "agent"
    assert entry.remote_addr == "10.9.0.7" and entry.target_type == "node" and entry.target_label == "n7"
    assert entry.detail["join_token"] == secret[:12] and secret not in json.dumps(entry.detail)


def test_health_override_is_recorded_when_it_changes(client, user):
    client.force_login(user)
    device = make_device(make_node(name="box"))
    url = f"/api/v1/devices/{device.pk}/"
    def patch(body, **extra) -> int:
        return client.patch(url, body, content_type="application/json", **extra).status_code

    assert patch({"health_override": "unhealthy"}, REMOTE_ADDR="10.4.0.1") == 200
    assert patch({"health_override": "unhealthy"}) == 200  # no change
    assert patch({"health_override": "sick"}) == 400
    assert patch({"fp16_tflops": 70.0}) == 200  # not the override
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.via, entry.remote_addr) == (
        "device.health_override", user, "session", "10.4.0.1")
    assert (entry.target_type, entry.target_label, entry.detail) == (
        "device", "box/gpu0", {"from": None, "to": "unhealthy"})


def test_an_emulated_throttle_is_recorded_and_a_refused_one_is_not(api):
    node = make_node(name="box", incarnation=1)
    card, real = make_device(node, emulated=True), make_device(node, emulated=False)
    def throttle(device):
        return api.post(f"/api/v1/devices/{device.pk}/emulate-throttle/", {"factor": 0.5}, format="json")

    assert throttle(card).status_code == 202
    refused = throttle(real)
    assert_error(refused, 400, "real device")
    assert entries() == [("device.throttle", "alice", "token", "box/gpu0")]
    assert AuditEntry.objects.get().detail == {"factor": 0.5}


def test_a_draft_saved_through_the_plans_api(api, nodes, llm):
    AuditEntry.objects.all().delete()
    response = api.post("/api/v1/plans/", {"model": llm.pk, "save": True, **REQUEST}, format="json")
    assert response.status_code == 201, response.content
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor_label, entry.target_type) == ("plan.saved", "alice", "plan_revision")
    assert entry.target_id == str(response.json()["revision"]) and entry.detail["model"] == "tiny"
    preview = api.post("/api/v1/plans/", {"model": llm.pk, **REQUEST}, format="json")
    assert preview.status_code == 200
    assert AuditEntry.objects.count() == 1


def test_health_override_changed_in_the_admin(client, django_user_model):
    root = django_user_model.objects.create_superuser("root", password=None)
    client.force_login(root)
    device = make_device(make_node(name="box"))
    url = reverse("admin:inventory_device_change", args=[device.pk])
    form = client.get(url).context["adminform"].form
    data = {name: ("" if value is None else value) for name, value in form.initial.items()
            if name in form.fields and not isinstance(value, (list, dict))}
    data.update(health_override="degraded", node=device.node_id)
    response = client.post(url, data, REMOTE_ADDR="10.5.0.1")
    assert response.status_code == 302, response.context["adminform"].form.errors
    client.post(url, data)  # the same again: no change
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.actor, entry.via, entry.remote_addr) == (
        "device.health_override", root, "admin", "10.5.0.1")
    assert entry.detail == {"from": None, "to": "degraded"}
