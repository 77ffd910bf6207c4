"""Random JSON bodies against every POST endpoint: a 201 or a 4xx naming fields, never a 500,
and a rejected request changes nothing that was stored."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.models import Experiment, Run, Schedule

from .conftest import post_json

pytestmark = pytest.mark.django_db

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=12)


def payloads(fields):
    keys = st.one_of(st.sampled_from(fields), st.text(max_size=12))
    return st.dictionaries(keys, json_values, max_size=5)


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def check(response, before, after):
    # 404: an id in the body that is not the user's (POST /api/runs/ answers as for any missing object)
    assert response.status_code in (201, 400, 404), (response.status_code, response.content[:300])
    if response.status_code in (400, 404):
        errors = response.json()["errors"]
        assert errors and all(isinstance(k, str) and isinstance(v, str) and v for k, v in errors.items())
        assert before == after


@FUZZ
@given(payload=payloads(["name", "description", "config"]))
def test_experiments_post_never_fails_with_500(alice_client, payload):
    before = list(Experiment.objects.values_list("pk", "config"))
    response = post_json(alice_client, "/api/experiments/", payload)
    check(response, before, list(Experiment.objects.values_list("pk", "config")))


@FUZZ
@given(payload=payloads(["name", "kind", "knobs"]))
def test_schedules_post_never_fails_with_500(alice_client, payload):
    before = list(Schedule.objects.values_list("pk", "knobs"))
    response = post_json(alice_client, "/api/schedules/", payload)
    check(response, before, list(Schedule.objects.values_list("pk", "knobs")))


@FUZZ
@given(payload=payloads(["experiment", "schedule", "steps", "name"]), use_real_ids=st.booleans())
def test_runs_post_never_fails_with_500(alice_client, alice_experiment, sync_preset, payload, use_real_ids):
    if use_real_ids:  # also reach the launch path behind the id checks
        payload = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, **payload}
    before = list(Run.objects.values_list("pk", "status"))
    response = post_json(alice_client, "/api/runs/", payload)
    check(response, before, list(Run.objects.values_list("pk", "status")))
