"""The queued-runs quota holds under concurrency: 30 launches of one user at once, each in
its own thread and PostgreSQL connection, never queue more than the quota (the count and the
insert share a transaction holding a lock on the user's row, controller/limits/quotas.py)."""

import threading

import pytest
from django.db import connection

from controller.supervision.launching import launch_run
from controller.models import Run, UserQuota
from controller.limits.quotas import QuotaExceeded

pytestmark = pytest.mark.django_db(transaction=True)
LAUNCHES, QUOTA = 30, 10


def test_30_parallel_launches_never_exceed_the_queue_quota(alice, alice_experiment, sync_preset, bob, bob_experiment):
    UserQuota.objects.create(user=alice, queued_runs=QUOTA)
    start = threading.Barrier(LAUNCHES + 1, timeout=60)
    outcomes: list[str] = []

    def launch(experiment) -> None:
        try:
            start.wait()
            launch_run(experiment, sync_preset, steps=1)
            outcomes.append("queued")
        except QuotaExceeded as err:
            assert err.status == 429
            outcomes.append("refused")
        finally:
            connection.close()  # this thread's own

    threads = [threading.Thread(target=launch, args=(alice_experiment,)) for _ in range(LAUNCHES)]
    for t in threads:
        t.start()
    start.wait()
    launch_run(bob_experiment, sync_preset, steps=1)  # another user is not held up by alice's lock
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert sorted(outcomes) == ["queued"] * QUOTA + ["refused"] * (LAUNCHES - QUOTA)
    assert Run.objects.filter(experiment=alice_experiment, status=Run.Status.QUEUED).count() == QUOTA
