"""Inputs the schema fuzz tests can draw whose answer matters, each pinned by name (test_api_schema.py)."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from tests.api.mixins import anonymous, api, user  # noqa: F401  (shared fixtures)


@pytest.mark.parametrize("url", ["/api/v1/nodes/1.5e-9/", "/api/v1/nodes/1%2F2/", "/api/v1/no-such-thing/"])
def test_a_url_no_route_matches_answers_the_api_error_not_an_html_page(api, url):
    response = api.get(url)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"] == {"code": "not_found",
                                        "message": f"no such URL: {response.wsgi_request.path}",
                                        "details": {}}


def test_an_unknown_gateway_url_answers_in_openai_shape(client, db):
    error = client.get("/v1/no-such-thing").json()["error"]
    assert (error["code"] == "not_found" and error["type"] == "invalid_request_error"
            and "no such URL" in error["message"])


def test_pages_outside_the_apis_keep_the_html_404(client, db):
    assert client.get("/no-such-page/")["Content-Type"].startswith("text/html")


def test_a_missing_row_and_an_unknown_format_are_coded_not_found(api):
    for url in ("/api/v1/nodes/12345/", "/api/v1/usage/?format=AAA"):
        response = api.get(url)
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found", url


def test_a_created_node_says_how_many_devices_it_has(api):
    response = api.post("/api/v1/nodes/", {"name": "fresh", "address": "10.0.0.9"}, format="json")
    assert response.status_code == 201 and response.json()["device_count"] == 0


def test_the_schema_documents_errors_and_an_event_without_deployment():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert (schema["components"]["schemas"]["DeploymentEvent"]["properties"]["deployment_name"]["nullable"]
            is True)
    register = schema["paths"]["/api/v1/agents/register/"]["post"]["responses"]
    assert {"400", "401", "403", "404", "409", "413", "415", "429"} <= set(register)
    assert register["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "429" not in schema["paths"]["/api/v1/nodes/"]["get"]["responses"]
