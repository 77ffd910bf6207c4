"""Connections stay bounded and no live update is lost under load, with Redis restarted and
PostgreSQL backends killed in the middle (bench/web/live_load.py; its 5-minute, 100-viewer run is
in docs/controller-faults.md, "Connections"). Scaled to the suite: 3 runs' worth of live spans (real
supervisors in a worker-like process on the production settings, stand-in learners), 18
websocket viewers, 10 API clients back to back against daphne on the production settings;
20 s of spans, under 60 s in all."""

import json

import pytest
from django.db import connection
from django.utils import timezone

from bench.web.live_load import load
from controller.models import Run

from .conftest import make_run
from .faults import production_password
from .faults import redis_server, web  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
POOL_MAX = 8  # THUNDERSYNC_DB_POOL_MAX's default (controller/settings/base.py)
RUNS, VIEWERS_PER_RUN, CLIENTS, SECONDS, RATE = 3, 6, 10, 20.0, 60.0


def test_connections_stay_bounded_and_every_update_arrives_through_a_redis_restart_and_killed_backends(
        web, redis_server, alice, alice_experiment, streaming_preset):
    production_password(alice, "alice-password")
    runs = [make_run(alice_experiment, streaming_preset, status=Run.Status.STARTING, heartbeat=timezone.now())
            for _ in range(RUNS)]  # stamped: daphne's reaper leaves them to the worker-like process starting up
    sessions = [web.login("alice", "alice-password") for _ in range(CLIENTS)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        spared = cursor.fetchone()[0]
    report = load(web, redis_server, connection.settings_dict["NAME"], spared, [r.pk for r in runs], sessions,
                  VIEWERS_PER_RUN, SECONDS, RATE, redis_at=6.0, pg_at=13.0, log_path=web.log_path.with_name("worker.log"))
    print("\n" + json.dumps(report, indent=1))
    assert report["pg_backends_terminated"] > 0
    assert set(report["run_statuses"].values()) == {"succeeded"}, (report, web.log_path.with_name("worker.log").read_text()[-3000:])
    # frames: every viewer ends with every span of its run and the final status (live or replayed)
    assert report["viewers_complete"] == RUNS * VIEWERS_PER_RUN, report
    assert report["spans_delivered"] == report["spans_sent"], report
    assert report["live_span_frames"] > 0  # not only replays: the live path worked around the faults
    # no 5xx, no dropped request, every process within its pool
    assert set(report["api_statuses"]) == {200}, report
    assert report["api_p95_ms"] < 5000, report
    most = report["connections_max"]
    assert 0 < most["daphne/postgres"] <= POOL_MAX and 0 < most["worker/postgres"] <= POOL_MAX, most
    # Redis is not pooled per process: a websocket's channel-layer receive holds one connection,
    # plus a few shared ones (publisher, group rejoins); so at most one per viewer and a handful
    assert most["daphne/redis"] <= RUNS * VIEWERS_PER_RUN + 6 and most["worker/redis"] <= 2 * RUNS, most
    assert b"Traceback" not in web.log_path.read_bytes()
