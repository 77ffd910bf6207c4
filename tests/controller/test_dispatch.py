"""Fair dispatch: queued runs of different users interleave, per-user concurrency limits hold."""

import pytest

from controller.celery import app
from controller.supervision.dispatch import claim_next_run
from controller.models import Experiment, Run, UserQuota
from controller.tasks import run_training

from .conftest import QUICKSTART, make_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def carol_experiment(django_user_model):
    carol = django_user_model.objects.create_user("carol", password="carol-password")
    return Experiment.objects.create(owner=carol, name="carol's", config=QUICKSTART)


def queue(experiment, preset, count: int) -> list[Run]:
    return [make_run(experiment, preset, status=Run.Status.QUEUED, name=f"{experiment.owner}-{i}")
            for i in range(count)]


def owner(run_id: int) -> str:
    return Run.objects.get(pk=run_id).experiment.owner.username


def finish(run_id: int) -> None:
    Run.objects.filter(pk=run_id).update(status=Run.Status.SUCCEEDED)


def test_queued_runs_interleave_round_robin_by_user(alice_experiment, bob_experiment, carol_experiment, sync_preset):
    """Alice queues four runs first, then Bob two, then Carol one: a FIFO would run all of
    Alice's before anyone else's."""
    queue(alice_experiment, sync_preset, 4)
    queue(bob_experiment, sync_preset, 2)
    queue(carol_experiment, sync_preset, 1)
    order = []
    while (run_id := claim_next_run()) is not None:
        assert Run.objects.get(pk=run_id).status == Run.Status.STARTING
        order.append(owner(run_id))
        finish(run_id)
    assert order == ["alice", "bob", "carol", "alice", "bob", "alice", "alice"]
    # Each user's own runs still start in the order they were queued.
    alice_runs = Run.objects.filter(experiment=alice_experiment).order_by("started").values_list("name", flat=True)
    assert list(alice_runs) == ["alice-0", "alice-1", "alice-2", "alice-3"]


def test_a_user_at_the_concurrency_limit_waits_while_others_start(alice, alice_experiment, bob_experiment,
                                                                   sync_preset):
    UserQuota.objects.create(user=alice, concurrent_runs=1)
    queue(alice_experiment, sync_preset, 2)
    queue(bob_experiment, sync_preset, 1)
    first, second = claim_next_run(), claim_next_run()
    assert (owner(first), owner(second)) == ("alice", "bob")
    assert claim_next_run() is None  # alice's second run waits for her first
    finish(first)
    third = claim_next_run()
    assert owner(third) == "alice" and Run.objects.get(pk=third).name == "alice-1"


def test_cancelled_and_running_runs_are_never_claimed(alice_experiment, sync_preset):
    make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING)
    make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED, cancel_requested=True)
    assert claim_next_run() is None


def queued_messages() -> int:
    with app.connection_for_write() as conn:
        return conn.default_channel.client.llen("runs")  # the client adds the test's key prefix


def purge() -> None:
    """An empty queue "runs", declared (bound), as a worker would: Redis drops messages
    for a queue nobody declared."""
    with app.connection_for_write() as conn:
        app.amqp.queues["runs"].bind(conn.default_channel).declare()
        conn.default_channel.queue_purge("runs")


def test_a_slot_starts_the_fairest_run_and_tops_up_after_it(alice_experiment, bob_experiment, sync_preset,
                                                          settings, tmp_path):
    """The task run with the slot of Alice's third run starts Bob's first (Alice already has
    two running); when that run ends (here at once: the learner cannot start) a new slot is
    queued for the runs still waiting."""
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    settings.THUNDERSYNC_LEARNER_COMMAND = [str(tmp_path / "no-such-learner")]
    make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING, started=None)
    make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING)
    alice_waiting = queue(alice_experiment, sync_preset, 1)[0]
    bob_run = queue(bob_experiment, sync_preset, 1)[0]
    purge()
    try:
        assert run_training.apply(args=[alice_waiting.pk]).get() == Run.Status.FAILED
        bob_run.refresh_from_db()
        assert bob_run.status == Run.Status.FAILED and "could not start the learner" in bob_run.error
        assert Run.objects.get(pk=alice_waiting.pk).status == Run.Status.QUEUED
        assert queued_messages() == 1
    finally:
        purge()


def cancel_during(monkeypatch, name: str, run: Run) -> list[int]:
    """Wrap ``controller.supervision.dispatch.<name>`` so that ``run`` is cancelled (as the cancel button
    does, launching.request_cancel) right after it was called: a cancel that lands inside the
    claim, deterministically. Returns the list of cancels done (one per call of the hook)."""
    import controller.supervision.dispatch as dispatch
    from controller.supervision.launching import request_cancel

    real, done = getattr(dispatch, name), []

    def racing(*args, **kwargs):
        result = real(*args, **kwargs)
        if not done:
            done.append(request_cancel(Run.objects.get(pk=run.pk)))
        return result

    monkeypatch.setattr(dispatch, name, racing)
    return done


def assert_cancelled_untouched(run: Run) -> None:
    run.refresh_from_db()
    assert run.status == Run.Status.CANCELLED and run.cancel_requested
    assert run.started is None and run.supervisor == "" and run.start_task_id == "" and not run.pids


def test_a_cancel_between_the_pick_and_the_claim_wins_and_the_worker_does_nothing(monkeypatch, alice_experiment,
                                                                                   sync_preset):
    """The run is picked, then cancelled, then the claim's UPDATE runs: it finds the run no
    longer queued and claims nothing (an unconditional claim made the cancelled run start)."""
    run = queue(alice_experiment, sync_preset, 1)[0]
    cancels = cancel_during(monkeypatch, "next_run_id", run)
    assert run_training.apply(args=[run.pk]).get() == "skipped"
    assert cancels == [True]
    assert_cancelled_untouched(run)
    assert claim_next_run() is None


def test_a_cancel_while_the_run_is_being_picked_raises_nothing(monkeypatch, alice_experiment, sync_preset):
    """The cancel lands after the pick saw the run's owner waiting and before it looked up
    that owner's oldest run (an IndexError in the worker before): nothing is claimed."""
    run = queue(alice_experiment, sync_preset, 1)[0]
    cancels = cancel_during(monkeypatch, "quotas_for", run)
    assert run_training.apply(args=[run.pk]).get() == "skipped"
    assert cancels == [True]
    assert_cancelled_untouched(run)


def test_a_lost_claim_picks_the_next_waiting_run(monkeypatch, alice_experiment, bob_experiment, sync_preset):
    """Alice's run is picked and cancelled before the claim: the same claim starts Bob's."""
    alice_run = queue(alice_experiment, sync_preset, 1)[0]
    bob_run = queue(bob_experiment, sync_preset, 1)[0]
    cancel_during(monkeypatch, "next_run_id", alice_run)
    assert claim_next_run("slot-1") == bob_run.pk
    assert_cancelled_untouched(alice_run)
    bob_run.refresh_from_db()
    assert bob_run.status == Run.Status.STARTING and bob_run.start_task_id == "slot-1"
