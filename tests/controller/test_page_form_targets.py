"""The pages' form targets (launch, compare, cancel, resume, annotate, clone, delete) take POST
only; any other visit - an address left in the bar after a form's error, a bookmark - answers a
styled 405 page with ``Allow: POST`` and a link to the page the form lives on, never the
browser's blank one."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from controller.models import Comparison, Schedule

from .conftest import make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def targets(alice_experiment, streaming_preset):
    run = make_run(alice_experiment, streaming_preset)
    comparison = Comparison.objects.create(experiment=alice_experiment, steps=3)
    schedule = Schedule.objects.create(owner=alice_experiment.owner, name="mine", kind="sync")
    e, r, c = alice_experiment.pk, run.pk, comparison.pk
    return {
        f"/experiments/{e}/launch/": f"/experiments/{e}/", f"/experiments/{e}/compare/": f"/experiments/{e}/",
        f"/experiments/{e}/clone/": f"/experiments/{e}/", f"/runs/{r}/cancel/": f"/runs/{r}/",
        f"/runs/{r}/resume/": f"/runs/{r}/", f"/runs/{r}/annotate/": f"/runs/{r}/",
        f"/comparisons/{c}/annotate/": f"/comparisons/{c}/", f"/comparisons/{c}/delete/": f"/comparisons/{c}/",
        f"/schedules/{schedule.pk}/delete/": "/schedules/",
    }


@pytest.mark.parametrize("method", ["get", "head"])
def test_a_visit_to_a_form_target_answers_a_styled_405_with_the_way_back(alice_client, targets, method):
    for url, back in targets.items():
        response = getattr(alice_client, method)(url)
        assert response.status_code == 405, url
        assert response["Allow"] == "POST", url
        if method == "get":
            page = response.content.decode()
            assert "<html" in page and 'id="method-not-allowed"' in page, url
            assert f'href="{back}" id="back-link"' in page, url
            assert "This address takes a form, not a visit" in page and "GET not allowed here" in page


def test_a_form_target_still_asks_a_visitor_to_log_in_first(targets):
    for url in targets:
        response = Client().get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], url


def test_a_post_to_a_form_target_still_works(alice_client, alice_experiment, targets):
    clone = f"/experiments/{alice_experiment.pk}/clone/"
    response = alice_client.post(clone)
    assert response.status_code == 302
    assert get_user_model().objects.get(pk=alice_experiment.owner_id).experiments.count() == 2


def test_the_experiment_page_has_no_duplicate_element_ids(alice_client, alice_experiment, streaming_preset):
    import re
    from collections import Counter

    Schedule.objects.create(owner=None, name="sync", kind="sync")
    page = alice_client.get(f"/experiments/{alice_experiment.pk}/").content.decode()
    ids = Counter(re.findall(r'\sid="([^"]+)"', page))
    assert [i for i, n in ids.items() if n > 1] == []
    # each form's labels point at its own fields
    for label_for in re.findall(r'<label for="([^"]+)"', page):
        assert ids[label_for] == 1, label_for
    assert 'for="compare_steps"' in page and 'for="id_steps"' in page


def test_a_sweep_of_a_field_the_config_lacks_is_named_before_the_run_count(alice_client, alice_experiment):
    presets = [Schedule.objects.create(owner=None, name=k, kind=k) for k in ("sync", "async", "streaming")]
    form = {"schedules": [p.pk for p in presets], "steps": 3, "sweep_field": "train.nope", "sweep_values": "1, 2"}
    page = alice_client.post(f"/experiments/{alice_experiment.pk}/compare/", form).content.decode()
    assert "train.nope: unknown field" in page and "pick at most" not in page
    from controller.config_merge import config_has_field
    assert config_has_field("train.lr") and config_has_field("seed") and config_has_field("model.lora.rank")
    assert not config_has_field("train.lr.x") and not config_has_field("nope")
