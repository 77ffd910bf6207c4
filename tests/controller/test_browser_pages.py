"""Login, experiments, experiment and cancel flows in a real browser against the real app
(no worker: a launched run stays queued, which is what the cancel flow needs)."""

import pytest
import yaml

from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)
from controller.models import Experiment, Run

from .conftest import QUICKSTART

pytestmark = pytest.mark.browser


def test_it_sends_anonymous_users_to_login_and_rejects_a_bad_password(live_url, browser_page, alice):
    page, errors = browser_page
    page.goto(f"{live_url}/")
    assert "/accounts/login/" in page.url
    page.fill("#id_username", "alice")
    page.fill("#id_password", "wrong")
    page.click("#login-form button[type=submit]")
    assert "Please enter a correct username and password" in page.inner_text(".error-box")
    screenshot(page, "login-error")
    log_in(page, live_url, "alice", "alice-password")
    assert page.inner_text("h1") == "Experiments"
    assert errors == []


def test_it_creates_an_experiment_launches_a_run_and_cancels_it(live_url, browser_page, alice, streaming_preset):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")

    # A config error comes back on the form, naming the field.
    page.fill("#id_name", "arith streaming")
    page.fill("#id_config", "train:\n  group_size: 0\n")
    page.click("#new-experiment button[type=submit]")
    assert "group_size" in page.inner_text("#new-experiment .errorlist")
    assert not Experiment.objects.exists()
    screenshot(page, "experiments-form-error")

    page.fill("#id_description", "quickstart config, streaming schedule")
    page.fill("#id_config", yaml.safe_dump(QUICKSTART))
    page.click("#new-experiment button[type=submit]")
    experiment = Experiment.objects.get(owner=alice, name="arith streaming")
    page.wait_for_url(f"{live_url}/experiments/{experiment.pk}/")
    assert page.inner_text("h1") == "arith streaming"
    assert "builtin:tiny" in page.inner_text("#experiment-config")  # pretty-printed from json_script

    page.select_option("#id_schedule", str(streaming_preset.pk))
    page.fill("#id_steps", "2")
    page.fill("#id_name", "to cancel")
    page.click("#launch-form button[type=submit]")
    run = Run.objects.get(experiment=experiment, name="to cancel")
    page.wait_for_url(f"{live_url}/runs/{run.pk}/")
    assert page.text_content("#status-badge") == "queued"
    page.wait_for_function("window.__thundersync.state().replayDone")
    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel <run>? ..." (the cancel is confirmed)
    page.click("#cancel-button")
    page.wait_for_url(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function("window.__thundersync.state().status === 'cancelled'")
    assert Run.objects.get(pk=run.pk).status == Run.Status.CANCELLED
    assert page.is_hidden("#cancel-form")
    assert "Cancelled" in page.inner_text(".messages")  # it was still queued: no "Cancelling"
    screenshot(page, "run-cancelled")

    page.goto(f"{live_url}/experiments/{experiment.pk}/")
    assert "cancelled" in page.text_content("#runs")
    screenshot(page, "experiment")
    page.goto(f"{live_url}/")
    assert "arith streaming" in page.inner_text("#experiments")
    screenshot(page, "experiments")
    assert errors == []


def test_edit_clone_and_delete_an_experiment_with_no_404_on_the_way(live_url, browser_page, alice, streaming_preset):
    page, errors = browser_page
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    log_in(page, live_url, "alice", "alice-password")
    page.fill("#id_name", "commented")
    page.fill("#id_config", "# as written\ntrain:\n  steps: 2   # short\n")
    page.click("#new-experiment button[type=submit]")
    page.wait_for_selector("#experiment-config")
    assert "# short" in page.inner_text("#experiment-config")
    assert page.input_value("#id_schedule") == str(streaming_preset.pk)

    page.click("#edit-link")
    page.fill("#id_config", "# edited\ntrain:\n  steps: 3\n")
    page.click("#edit-experiment button[type=submit]")
    page.wait_for_selector(".messages")
    assert "# edited" in page.inner_text("#experiment-config")
    assert Experiment.objects.get(name="commented").config == {"train": {"steps": 3}}

    page.click("#clone-button")
    page.wait_for_selector("#edit-experiment")
    assert Experiment.objects.filter(name="commented (copy)").exists()
    copy = Experiment.objects.get(name="commented (copy)")
    page.goto(f"{live_url}/experiments/{copy.pk}/")
    page.click("#delete-link")
    assert page.inner_text("#delete-runs") == "0"
    page.click("#confirm-delete")
    page.wait_for_url(f"{live_url}/")
    assert not Experiment.objects.filter(pk=copy.pk).exists()
    assert missing == [] and errors == []
