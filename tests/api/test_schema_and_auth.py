from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


def test_schema_lists_every_resource(api, anonymous):
    assert anonymous.get("/api/schema/").status_code in (401, 403)
    paths = api.get("/api/schema/", {"format": "json"}).json()["paths"]
    for resource in ("nodes", "devices", "links", "models", "gpu-models"):
        assert f"/api/v1/{resource}/" in paths
    assert "/api/v1/models/{id}/profile/" in paths


def test_docs_page_renders_offline_from_the_schema(client, user):
    assert client.get("/api/docs/").status_code == 302  # to the login page
    client.force_login(user)
    page = client.get("/api/docs/").content.decode()
    assert "/api/v1/nodes/{id}/" in page and "PaginatedNodeList" in page
    assert "cdn" not in page.lower() and "<script" not in page


def test_interactive_docs_are_served_locally(client, user):
    assert client.get("/api/docs/try/").status_code in (302, 401, 403)
    client.force_login(user)
    page = client.get("/api/docs/try/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in page and "/api/schema/" in page
    assert "cdn" not in page.lower()
    assert 'href="/api/docs/try/"' in client.get("/api/docs/").content.decode()


def test_create_api_token_prints_a_working_key(user):
    out = StringIO()
    call_command("create_api_token", "alice", stdout=out)
    key = out.getvalue().strip()
    assert Token.objects.get(user=user).key == key
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/nodes/").status_code == 200

    again = StringIO()
    call_command("create_api_token", "alice", stdout=again)
    assert again.getvalue().strip() == key  # stable until reset
    call_command("create_api_token", "alice", "--reset", stdout=again)
    assert Token.objects.get(user=user).key != key
    assert client.get("/api/v1/nodes/").status_code == 401


@pytest.mark.django_db
def test_create_api_token_for_an_unknown_user():
    with pytest.raises(CommandError, match="no user 'bob'; create one first with: python manage.py create"):
        call_command("create_api_token", "bob")


def test_errors_are_json_with_a_message(api):
    response = api.post("/api/v1/devices/", {"node": 12345}, format="json")
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "invalid"
    assert "node: Invalid pk \"12345\" - object does not exist." in error["message"]
    assert "model_name: This field is required." in error["message"]


def test_the_schema_generates_without_warnings_and_validates(tmp_path):
    """Warnings (an enum name clash, a field spectacular cannot type) fail the generation."""
    schema = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(schema))
    text = schema.read_text()
    assert "PlanRevisionSourceEnum:" in text and "PlanInputSourceEnum:" in text
