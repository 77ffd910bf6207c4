"""The JSON API: its views, errors, OpenAPI schema, serializers and pagination (docs/controller-api.md)."""
