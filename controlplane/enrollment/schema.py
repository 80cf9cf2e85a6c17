"""OpenAPI description of the node credential scheme (loaded by the app config)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class NodeCredentialScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.enrollment.authentication.NodeCredentialAuthentication"
    name = "nodeCredential"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Node <node_id>:<node_credential>`, as returned by agent registration."}
