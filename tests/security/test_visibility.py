"""What each signed-in caller sees on every read route: a plain user, an operator (the ``operators``
group, not staff) and staff.

The authorization matrix says who may call a route; this says what the answer may hold. Every GET
route (walked from the URL conf, as the matrix does) is read by each caller against a database that
holds one of everything that must not travel: a pipeline's auth token, a node's credential, a join
token, the API keys themselves; another user's key prefix, an operator's name and the client address
the audit trail keeps. No caller ever gets the first kind; the second is for whom docs/api.md ("Who
sees what") says, and that table names every route.
"""

from __future__ import annotations

import re
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from contracts.fleet_file import load_fleet_file
from controlplane.asgi import application
from controlplane.audit.services import Actor, Target, audit_record
from controlplane.common.permissions import STAFF_ONLY_MESSAGE
from controlplane.deployments.models import DeploymentEvent, DeploymentPipeline
from controlplane.enrollment.services import join_token_create
from controlplane.gateway.accounts.services import api_key_create
from controlplane.gateway.models import ApiKey
from controlplane.gateway.traces.store import StoreExporter
from controlplane.inventory.models import Device, Link, Node
from controlplane.inventory.services import fleet_import
from controlplane.models_catalog.services import model_register
from controlplane.rebalance.models import RebalanceProposal
from tests.dashboard.seed import LAB_FLEET, LLAMA3_8B, running_deployment_create
from tests.security.principals import principals_create
from tests.security.routes import http_routes, websocket_routes
from tests.support.trace_samples import request_trace

API_DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
CALLERS = ("plain", "operator", "admin")
CLIENT_ADDRESS = "198.51.100.77"  # where the operator's audited action came from
PIPELINE_TOKEN = "pipeline-secret-3f9c1d"


def _servable_model(directory: Path):
    """Llama-3-8B's config with a one-word tokenizer: the gateway serves it (so its router view holds
    the deployment's pipelines), though no stage ever runs."""
    directory.mkdir()
    shutil.copy(LLAMA3_8B, directory / "config.json")
    Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(directory / "tokenizer.json"))
    return model_register(path=directory)


@pytest.fixture
def world(db, tmp_path, settings) -> dict:
    """The principals, a READY deployment, an accepted proposal, an audited action, a kept trace and the
    secrets."""
    # No stage runs: the router's poll of each head gives up at once rather than after the default.
    settings.MOTLEY_GATEWAY = {**settings.MOTLEY_GATEWAY, "CLIENT_TIMEOUT_S": 0.05}
    principals = principals_create()
    plain, operator = principals["plain"].user, principals["operator"].user
    fleet_import(fleet=load_fleet_file(LAB_FLEET))
    deployment = running_deployment_create(model=_servable_model(tmp_path / "llama"))
    DeploymentPipeline.objects.filter(deployment=deployment).update(auth_token=PIPELINE_TOKEN)
    revision = deployment.revision
    RebalanceProposal.objects.create(
        deployment=deployment, base_revision=revision, revision=revision, trigger="fleet",
        reason="a node back", gain=0.1, current_tokens_per_s=10.0, proposed_tokens_per_s=11.0,
        status="accepted", decided_at=timezone.now(), decided_by=operator)
    operator_key, operator_raw_key = api_key_create(user=operator, name="ops")
    entry = audit_record(actor=Actor(user=operator, label=operator.username, via="session",
                                     remote_addr=CLIENT_ADDRESS),
                         action="node.cordoned", target=Target("node", "1", "matrix-a"))
    traced = request_trace()
    StoreExporter().export(traced.gateway + traced.stage)
    ids = {"api-keys": operator_key.pk, "audit": entry.pk, "deployments": deployment.pk,
           "devices": Device.objects.first().pk, "events": DeploymentEvent.objects.first().pk,
           "links": Link.objects.first().pk, "models": deployment.model_id, "nodes": Node.objects.first().pk,
           "gpu-models": "T4", "traces": traced.trace_id}
    never = [PIPELINE_TOKEN, join_token_create(ttl=timedelta(hours=1)).secret, operator_raw_key,
             principals["api_key"].raw["authorization"].removeprefix("Bearer "),
             principals["node"].raw["authorization"].rpartition(":")[2]]
    plain_prefix = ApiKey.objects.get(user=plain).prefix
    hidden = {"plain": [operator_key.prefix, operator.username, CLIENT_ADDRESS],
              "operator": [plain_prefix, CLIENT_ADDRESS], "admin": []}
    return {"principals": principals, "ids": ids, "never": never, "hidden": hidden,
            "plain_prefix": plain_prefix, "deployment": deployment, "operator": operator}


def _path(template: str, ids: dict) -> str:
    """The route with each parameter the id of a row that exists (the segment before it names whose)."""
    def value(match: re.Match) -> str:
        owner = template[:match.start()].rstrip("/").rpartition("/")[2]
        assert owner in ids, f"{template}: give tests/security/test_visibility.py a {owner} row to read"
        return str(ids[owner])
    return re.sub(r"\{\w+\}", value, template)


@pytest.mark.parametrize("caller", CALLERS)
def test_no_read_route_shows_a_caller_what_is_not_theirs(world, caller):
    client = world["principals"][caller].client()
    leaks = []
    for route in http_routes():
        if "GET" not in route.methods:
            continue
        body = client.get(_path(route.template, world["ids"])).content.decode(errors="replace")
        leaks += [f"GET {route.template}: {secret}" for secret in world["never"] + world["hidden"][caller]
                  if secret in body]
    assert not leaks, f"{caller} reads what is not theirs:\n" + "\n".join(leaks)


def test_the_audit_trail_is_staff_only_with_a_clear_refusal(world):
    principals = world["principals"]
    for caller in ("plain", "operator"):
        client = principals[caller].client()
        refused = client.get("/api/v1/audit/")
        assert refused.status_code == 403 and "staff only" in refused.json()["error"]["message"]
        page = client.get("/audit/")
        assert page.status_code == 403 and page.content.decode() == STAFF_ONLY_MESSAGE
        assert 'href="/audit/"' not in client.get("/topology/").content.decode()  # no link to it
    admin = principals["admin"].client()
    assert CLIENT_ADDRESS in admin.get("/api/v1/audit/").content.decode()
    assert CLIENT_ADDRESS in admin.get("/audit/").content.decode()
    assert 'href="/audit/"' in admin.get("/topology/").content.decode()


def test_who_decided_a_proposal_is_for_operators(world):
    url = f"/api/v1/deployments/{world['deployment'].pk}/proposals/"
    decided_by = {caller: world["principals"][caller].client().get(url).json()["results"][0]["decided_by"]
                  for caller in CALLERS}
    name = world["operator"].username
    assert decided_by == {"plain": None, "operator": name, "admin": name}


def test_a_plain_user_reads_their_own_key(world):
    """The sweep's negative checks are not vacuous: the caller's own key prefix is shown to them."""
    keys = world["principals"]["plain"].client().get("/api/v1/api-keys/").json()["results"]
    assert [key["prefix"] for key in keys] == [world["plain_prefix"]]


def _table_routes() -> set[str]:
    """The paths named in the first column of docs/api.md's "Who sees what" table."""
    section = API_DOC.read_text().split("### Who sees what", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {path for line in rows for path in re.findall(r"`(/[^`]*)`", line.split("|")[1])}


def test_the_docs_state_the_rule_of_every_route():
    routes = {route.template for route in http_routes()} | set(websocket_routes(application))
    documented = _table_routes()
    assert not routes - documented, f'routes missing from docs/api.md, "Who sees what": {routes - documented}'
    assert not documented - routes, f'docs/api.md, "Who sees what", names no route: {documented - routes}'
