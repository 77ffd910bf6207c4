import re

import pytest
from django.test import Client

from controller.urls import api_urlpatterns

pytestmark = pytest.mark.django_db


def openapi_path(route: str) -> str:
    return "/" + re.sub(r"<int:(\w+)>", r"{\1}", route)


def test_it_requires_login():
    assert Client().get("/api/openapi.json").status_code == 401


def test_it_describes_exactly_the_api_routes(alice_client):
    schema = alice_client.get("/api/openapi.json").json()
    assert schema["openapi"].startswith("3.")
    assert set(schema["paths"]) == {openapi_path(str(p.pattern)) for p in api_urlpatterns}


def test_every_reference_resolves(alice_client):
    schema = alice_client.get("/api/openapi.json").json()
    refs = set(re.findall(r'"\$ref": "#/components/schemas/(\w+)"', str(schema).replace("'", '"')))
    assert refs and refs <= set(schema["components"]["schemas"])


def test_documented_methods_match_the_views(alice_client):
    """A method the schema does not list answers 405; one it lists does not."""
    schema = alice_client.get("/api/openapi.json").json()
    for path, operations in schema["paths"].items():
        concrete = path.replace("{run_id}", "999999").replace("{experiment_id}", "999999").replace("{traj}", "0").replace(
            "{comparison_id}", "999999")
        for method in ("get", "post"):
            response = getattr(alice_client, method)(concrete)
            assert (response.status_code == 405) == (method not in operations), (method, path)


def test_every_steps_input_is_bounded_by_the_users_quota_as_the_server_is(alice_client, alice_experiment):
    from controller.models import Schedule
    from controller.limits.quotas import quota_for

    from .conftest import post_json

    limit = quota_for(alice_experiment.owner).steps
    schemas = alice_client.get("/api/openapi.json").json()["components"]["schemas"]
    assert schemas["RunInput"]["properties"]["steps"]["maximum"] == limit
    assert schemas["ComparisonInput"]["properties"]["steps"]["maximum"] == limit
    presets = [Schedule.objects.create(owner=None, name=k, kind=k) for k in ("sync", "streaming")]
    over = post_json(alice_client, "/api/comparisons/", {"experiment": alice_experiment.pk, "steps": limit + 1,
                                                         "schedules": [p.pk for p in presets]})
    assert over.status_code == 400 and "quota" in over.json()["errors"]["steps"]
