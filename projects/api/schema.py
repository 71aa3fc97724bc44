"""How the OpenAPI schema describes Muster's token authentication (imported by ProjectsConfig.ready)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "projects.services.tokens.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <key>`; a key comes from `manage.py muster_token USERNAME`"}
