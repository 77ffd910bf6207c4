"""No 500 from an outage, on the production shape: daphne with
``controller.settings.production`` (persistent PostgreSQL connections; Redis as cache,
broker and channel layer), PostgreSQL backends terminated every 50 ms, a private Redis
crashed. Every answer is the page or a 503 with Retry-After (JSON under /api/); a launch
while the broker is down leaves no run behind; logins keep working; the websocket closes
4503 (try again later). docs/controller-faults.md "Outages" describes the guarantees under test."""

import asyncio
import time

import pytest
import websockets

from controller.live.socket_admission import CLOSE_TRY_AGAIN_LATER
from controller.models import Run

from django.db import connection

from .faults import BackendTerminator, ProductionWeb, TcpGate, production_password, wait_until
from .faults import redis_server, web  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def alice(alice):
    """Alice's password hashed with a hasher production accepts (the test settings use MD5)."""
    return production_password(alice, "alice-password")


def assert_outage_answer(response) -> None:
    assert response.status_code == 503, (response.status_code, response.text[-1500:])
    assert response.headers["Retry-After"].isdigit()


def test_a_flapping_database_answers_503_never_500(web, alice, alice_experiment, sync_preset):
    run = Run.objects.create(experiment=alice_experiment, schedule=sync_preset, steps=3, config={})
    session = web.login("alice", "alice-password")
    paths = [f"/api/runs/{run.pk}/", "/api/runs/", f"/runs/{run.pk}/", "/"]
    statuses: dict[int, int] = {}
    with BackendTerminator(0.05) as terminator:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for path in paths:
                response = session.get(web.url + path, timeout=30, allow_redirects=False)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code != 200:
                    assert_outage_answer(response)
                    if path.startswith("/api/"):
                        assert "database" in response.json()["errors"]["service"]
                    else:
                        assert "Temporarily unavailable" in response.text
    log = web.log_path.read_text()
    # the fault hit: reads were run again on a fresh connection (or, twice cut, answered 503)
    assert terminator.terminated > 0 and "the database connection was lost" in log, statuses
    assert set(statuses) <= {200, 503}, statuses
    print(f"statuses under a flapping database: {statuses}")
    # back within a moment: the pool's reconnect attempts that the flapping failed give up within
    # THUNDERSYNC_DB_RECONNECT_S, and the next request opens a connection (controller/postgres/base.py)
    start = time.monotonic()
    wait_until(lambda: session.get(web.url + f"/api/runs/{run.pk}/", timeout=30).status_code == 200, 5,
               "answers 200 again once the backends are left alone")
    print(f"first 200 after the flapping stopped: {time.monotonic() - start:.2f}s")


def test_a_database_that_is_down_answers_503_at_once_and_serves_again_when_back(redis_server, tmp_path, alice,
                                                                                  alice_experiment, sync_preset):
    """PostgreSQL stopped, as its clients see it (TcpGate in front of it shut: connects refused,
    every connection cut), with production's 5 s wait for a pooled connection: every request
    answers 503 with Retry-After without waiting for the pool (it waited 5 s, and a GET was tried
    three times: 10-15 s), reads and writes, API and pages; once the server is back, 200 again."""
    run = Run.objects.create(experiment=alice_experiment, schedule=sync_preset, steps=3, config={})
    db = connection.settings_dict
    gate = TcpGate(int(db["PORT"])).open()
    web = ProductionWeb(redis_server.url, tmp_path / "runs", tmp_path / "daphne.log", env={
        "DATABASE_URL": f"postgres://{db['USER']}@127.0.0.1:{gate.port}/{db['NAME']}",
        "THUNDERSYNC_DB_POOL_TIMEOUT_S": "5"})
    try:
        session = web.login("alice", "alice-password")
        assert session.get(f"{web.url}/api/runs/{run.pk}/", timeout=30).status_code == 200
        gate.shut()
        took = []
        for path in [f"/api/runs/{run.pk}/", "/api/runs/", f"/runs/{run.pk}/", "/"] * 2:
            start = time.monotonic()
            response = session.get(web.url + path, timeout=60, allow_redirects=False)
            took.append(time.monotonic() - start)
            assert_outage_answer(response)
            if path.startswith("/api/"):
                assert "database" in response.json()["errors"]["service"]
        start = time.monotonic()
        launched = session.post(web.url + "/api/runs/", timeout=60, json={
            "experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 3})
        took.append(time.monotonic() - start)
        assert_outage_answer(launched)
        # none waited out the pool's 5 s (on this shared machine, allow for load: typically ~0.5 s)
        assert max(took) < 4.0 and sorted(took)[len(took) // 2] < 2.0, took
        gate.open()
        back = wait_until(lambda: session.get(f"{web.url}/api/runs/{run.pk}/", timeout=30).status_code == 200, 15,
                          "answers again once the database is back")
        assert back
        assert b"Traceback" not in web.log_path.read_bytes()
    finally:
        web.stop()
        gate.shut()


async def websocket_close_code(url: str, cookies: dict[str, str]) -> int:
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()), "Origin": url.replace("ws", "http", 1)}
    async with websockets.connect(url, additional_headers=headers, open_timeout=30) as socket:
        try:
            while True:
                await asyncio.wait_for(socket.recv(), timeout=30)
        except websockets.ConnectionClosed as closed:
            return closed.rcvd.code if closed.rcvd else 1006


def test_with_redis_down_logins_work_launches_are_refused_and_the_websocket_says_try_later(
        web, redis_server, alice, alice_experiment, sync_preset):
    run = Run.objects.create(experiment=alice_experiment, schedule=sync_preset, steps=3, config={})
    session = web.login("alice", "alice-password")
    redis_server.crash()
    assert web.login("alice", "alice-password").cookies["sessionid"]  # the throttle fails open
    before = Run.objects.count()
    launched = session.post(web.url + "/api/runs/", timeout=60, json={
        "experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 3})
    assert_outage_answer(launched)
    assert "message broker" in launched.json()["errors"]["service"]
    assert Run.objects.count() == before  # no run without its message
    ws_url = web.url.replace("http", "ws", 1) + f"/ws/runs/{run.pk}/"
    assert asyncio.run(websocket_close_code(ws_url, session.cookies.get_dict())) == CLOSE_TRY_AGAIN_LATER
    redis_server.start()
    relaunched = session.post(web.url + "/api/runs/", timeout=60, json={
        "experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 3})
    assert relaunched.status_code == 201, relaunched.text
    assert b"Traceback" not in web.log_path.read_bytes()
