"""The embedded default: demo command, in-memory broker worker thread, thread-safe layer."""

import asyncio
import re

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import authenticate
from django.core.management import call_command

from controller.live.embedded_layer import EmbeddedChannelLayer
from controller.supervision.embedded_worker import EmbeddedWorker
from controller.management.commands.demo import DEMO_STEPS, DEMOS
from controller.models import Experiment, Run, Schedule

from .conftest import QUICKSTART, make_run, wait_for_status


@pytest.mark.django_db
def test_demo_setup_prints_a_working_login(capsys):
    call_command("demo", "--setup-only")
    out = capsys.readouterr().out
    password = re.search(r"^password: (\S+)$", out, re.M).group(1)
    assert "url: http://127.0.0.1:8000/" in out
    # where this demo keeps its data, and the variables a second, separate demo sets (README)
    from django.conf import settings

    assert f"database: {settings.DATABASES['default']['NAME']} (THUNDERSYNC_SQLITE)" in out
    assert f"run files: {settings.THUNDERSYNC_RUN_DIR} (THUNDERSYNC_RUN_DIR)" in out
    user = authenticate(username="demo", password=password)
    assert user is not None
    # configs/quickstart.yaml, with the demo's step count (a chart worth reading)
    assert Experiment.objects.get(owner=user, name="quickstart").config == {**QUICKSTART, "train": {**QUICKSTART["train"], "steps": DEMO_STEPS}}
    assert {"sync", "streaming"} <= set(Schedule.objects.filter(owner=None).values_list("kind", flat=True))


@pytest.mark.django_db
def test_demo_setup_can_run_twice(capsys):
    call_command("demo", "--setup-only")
    call_command("demo", "--setup-only")
    assert Experiment.objects.count() == 1 + len(DEMOS) and Schedule.objects.count() == 4


@pytest.mark.django_db
def test_the_demo_experiments_load_their_config_files_and_compare_the_four_schedules(capsys, settings):
    """Beside the quickstart, an experiment per demo config file (at balance, rollout-bound long tail),
    loaded as the file stands, its purpose and the file's own shape in the description; the compare
    form's defaults tick the four schedules and launch a comparison the compare page holds whole."""
    import yaml

    from controller.comparisons.compare import MAX_LAUNCHED
    from controller.forms import DEFAULT_REPEATS, ComparisonForm

    call_command("demo", "--setup-only")
    out = capsys.readouterr().out
    user = Experiment.objects.get(name="quickstart").owner
    for name, file, purpose in DEMOS:
        experiment = Experiment.objects.get(owner=user, name=name)
        text = (settings.BASE_DIR / "configs" / file).read_text()
        config = yaml.safe_load(text)
        assert experiment.config_text == text and experiment.config == config
        assert experiment.description.startswith(purpose) and f"configs/{file}" in experiment.description
        train = config["train"]
        assert f"{train['steps']} steps of {train['prompts_per_step']} prompts x {train['group_size']}" in experiment.description
        assert f"{name}: http://127.0.0.1:8000/experiments/{experiment.pk}/" in out
        form = ComparisonForm(user=user, experiment=experiment)
        ticked = Schedule.objects.filter(pk__in=form.fields["schedules"].initial)
        assert sorted(s.kind for s in ticked) == ["async", "fully-async", "streaming", "sync"]
        assert 4 * DEFAULT_REPEATS <= MAX_LAUNCHED  # the defaults fit one comparison's page
    assert "at balance" in DEMOS[0][0] and "long tail" in DEMOS[1][0]
    # a file changed since (another tuning) is picked up on the next start; nothing is duplicated
    call_command("demo", "--setup-only")
    assert Experiment.objects.filter(owner=user).count() == 1 + len(DEMOS)


async def test_the_embedded_layer_takes_sends_from_another_thread():
    layer = EmbeddedChannelLayer()
    channel = await layer.new_channel()
    await layer.group_add("run_1", channel)
    received = asyncio.ensure_future(layer.receive(channel))
    await asyncio.sleep(0)  # the receiver waits on this loop, as daphne's consumers do
    # The embedded Celery worker publishes from its own thread and its own event loop.
    await asyncio.to_thread(async_to_sync(layer.group_send), "run_1", {"type": "run.frame", "frame": {"n": 1}})
    assert await asyncio.wait_for(received, timeout=5) == {"type": "run.frame", "frame": {"n": 1}}


@pytest.mark.django_db(transaction=True)
def test_the_in_memory_broker_worker_thread_runs_the_run_task(
    memory_broker_app, settings, tmp_path, alice_experiment, sync_preset
):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    settings.THUNDERSYNC_LEARNER_COMMAND = [str(tmp_path / "no-such-learner")]
    run = make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED)
    worker = EmbeddedWorker(memory_broker_app, queues=["runs"]).start()
    try:
        memory_broker_app.send_task("controller.tasks.run_training", args=[run.pk], queue="runs")
        failed = wait_for_status(run.pk, {"failed"}, timeout=60)
    finally:
        worker.stop()
    assert failed.started is not None  # the worker claimed it...
    assert failed.error.startswith(f"could not start the learner {tmp_path / 'no-such-learner'}")
    assert (tmp_path / f"run-{run.pk}" / "config.yaml").exists()
