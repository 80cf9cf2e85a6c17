"""A self-hosted API reference page, rendered on the server from the OpenAPI schema.

drf-spectacular's Swagger and Redoc views load their JavaScript from a CDN, which an air-gapped
control plane cannot reach; this page needs nothing but the schema itself.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.mixins import LoginRequiredMixin
from django.views.generic import TemplateView
from drf_spectacular.generators import SchemaGenerator

METHODS = ("get", "post", "put", "patch", "delete")


class ApiDocsView(LoginRequiredMixin, TemplateView):
    template_name = "api/docs.html"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        schema = SchemaGenerator().get_schema(request=None, public=True)
        operations = [
            {
                "path": path,
                "method": method.upper(),
                "summary": operation.get("summary") or operation.get("description", "").split("\n")[0],
                "resource": path.removeprefix("/api/v1/").split("/")[0],
                "parameters": [
                    {"name": p["name"], "in": p["in"], "description": p.get("description", "")}
                    for p in operation.get("parameters", [])
                ],
                "request": _schema_name(operation.get("requestBody", {}).get("content", {})),
                "responses": {
                    code: _schema_name(response.get("content", {}))
                    for code, response in operation["responses"].items()
                },
            }
            for path, item in schema["paths"].items()
            for method, operation in item.items()
            if method in METHODS
        ]
        operations.sort(key=lambda op: op["resource"])  # stable: paths keep their order within a resource
        return {**super().get_context_data(**kwargs), "info": schema["info"], "operations": operations}


def _schema_name(content: dict[str, Any]) -> str:
    """The component a request or response body refers to, e.g. 'PaginatedNodeList'."""
    body = content.get("application/json", {}).get("schema", {})
    reference = body.get("$ref") or body.get("items", {}).get("$ref", "")
    return reference.rsplit("/", 1)[-1] or body.get("type", "")
