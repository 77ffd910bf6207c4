"""The run page after the server refuses its socket for good (4401, 4404): it says why and
stops reconnecting (docs/web-contract.md, Websocket). Debian's chromium against daphne."""

import pytest
from django.contrib.sessions.models import Session
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.models import Run

from .conftest import make_run, store_spans

pytestmark = [pytest.mark.browser]
STATE = "window.__thundersync.state()"


def open_live_page(page, live_url, run) -> None:
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.open", timeout=30_000)


def assert_stays_closed(page, message: str) -> None:
    page.wait_for_function("!document.getElementById('error-box').hidden", timeout=30_000)
    assert message in page.text_content("#error-box")
    connects = page.evaluate(f"{STATE}.connects")
    # Longer than the page's first retry delays (0.5 s, then 1 s): no new attempt follows.
    page.wait_for_timeout(2500)
    assert page.evaluate(f"{STATE}.connects") == connects
    assert page.text_content("#conn") == "closed"


def test_an_expired_session_and_a_deleted_run_stop_the_reconnects(
    live_url, browser_page, alice, alice_experiment, streaming_preset
):
    page, errors = browser_page
    running = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING)
    doomed = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING)
    store_spans(running, 10)
    log_in(page, live_url, "alice", "alice-password")

    open_live_page(page, live_url, doomed)
    doomed.delete()
    page.evaluate("window.__thundersync.reconnect()")  # as after a network drop
    assert_stays_closed(page, "no longer exists or is not yours")

    open_live_page(page, live_url, running)
    Session.objects.all().delete()  # the session expires
    page.evaluate("window.__thundersync.reconnect()")
    assert_stays_closed(page, "Your session has expired")
    assert not errors
