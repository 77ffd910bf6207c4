"""Experiment edit/clone/delete, the runs table, schedule presets in the UI, favicon."""

import pytest

from controller.models import Experiment, Run, Schedule, Span, StepMetric
from controller.supervision.runlog import run_dir

from .conftest import make_run, store_metrics, store_spans

pytestmark = pytest.mark.django_db

WRITTEN = "# a tiny run\ntrain:\n  steps: 3   # keep it short\n  group_size: 4\n"


def test_the_yaml_is_kept_as_written_and_shown_as_written(alice_client):
    alice_client.post("/", {"name": "commented", "config": WRITTEN})
    experiment = Experiment.objects.get(name="commented")
    assert experiment.config_text == WRITTEN and experiment.config == {"train": {"steps": 3, "group_size": 4}}
    page = alice_client.get(f"/experiments/{experiment.pk}/").content.decode()
    assert "# keep it short" in page
    assert alice_client.get(f"/experiments/{experiment.pk}/edit/").context["form"]["config"].value() == WRITTEN


def test_an_api_experiment_without_text_is_shown_as_yaml(alice_experiment, alice_client):
    assert "builtin:tiny" in alice_client.get(f"/experiments/{alice_experiment.pk}/").context["experiment"].config_yaml()


def test_an_edit_changes_new_runs_and_keeps_old_runs_configs(alice_client, alice_experiment, sync_preset):
    old = make_run(alice_experiment, sync_preset, steps=2)
    old_config = dict(old.config)
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/edit/",
                                 {"name": "renamed", "description": "", "config": WRITTEN})
    assert response.status_code == 302
    alice_experiment.refresh_from_db()
    assert alice_experiment.name == "renamed" and alice_experiment.config_text == WRITTEN
    old.refresh_from_db()
    assert old.config == old_config
    alice_client.post(f"/experiments/{alice_experiment.pk}/launch/", {"schedule": sync_preset.pk, "name": "new"})
    new = Run.objects.get(name="new")
    assert new.config["train"]["group_size"] == 4 and new.steps == 3


def test_a_bad_edit_names_the_field_and_changes_nothing(alice_client, alice_experiment):
    before = alice_experiment.config
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/edit/", {"name": "x", "config": "train: {steps: -1}"})
    assert response.status_code == 400 and "train.steps" in response.context["form"].errors["config"][0]
    alice_experiment.refresh_from_db()
    assert alice_experiment.config == before and alice_experiment.name == "quickstart"


def test_clone_copies_the_config_not_the_runs(alice_client, alice_experiment, alice_run):
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/clone/")
    copy = Experiment.objects.exclude(pk=alice_experiment.pk).get()
    assert response["Location"] == f"/experiments/{copy.pk}/edit/"
    assert copy.name == "quickstart (copy)" and copy.config == alice_experiment.config and not copy.runs.exists()


def test_delete_asks_first_then_removes_the_runs_and_their_data(alice_client, alice_experiment, alice_run):
    store_spans(alice_run, 8)
    store_metrics(alice_run)
    confirm = alice_client.get(f"/experiments/{alice_experiment.pk}/delete/")
    assert confirm.context["runs"] == 1 and confirm.context["spans"] == 8
    assert Experiment.objects.filter(pk=alice_experiment.pk).exists()
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/delete/")
    assert response["Location"] == "/"
    assert not Experiment.objects.exists() and not Run.objects.exists()
    assert not Span.objects.exists() and not StepMetric.objects.exists()


def test_delete_removes_every_runs_directory_and_only_theirs(alice_client, alice_experiment, alice_run, sync_preset,
                                                             settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path / "runs"
    other_experiment = Experiment.objects.create(owner=alice_experiment.owner, name="kept", config={})
    runs = [alice_run, make_run(alice_experiment, sync_preset), make_run(other_experiment, sync_preset)]
    for run in runs:  # what a learner leaves: config, log, a checkpoint
        (run_dir(run.pk) / "output" / "checkpoints" / "step-000000").mkdir(parents=True)
        (run_dir(run.pk) / "learner.stderr.log").write_text("step 0\n")
    assert alice_client.post(f"/experiments/{alice_experiment.pk}/delete/").status_code == 302
    assert [run_dir(run.pk).exists() for run in runs] == [False, False, True]


def test_delete_keeps_an_experiment_with_a_run_in_flight(alice_client, alice_experiment, streaming_preset):
    make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING)
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/delete/")
    assert response.status_code == 409 and "cancel" in response.content.decode()
    assert Run.objects.count() == 1


def test_others_cannot_edit_clone_or_delete(bob_client, alice_experiment):
    for path in ("edit/", "delete/"):
        assert bob_client.get(f"/experiments/{alice_experiment.pk}/{path}").status_code == 404
    for path in ("edit/", "clone/", "delete/"):
        assert bob_client.post(f"/experiments/{alice_experiment.pk}/{path}").status_code == 404
    assert Experiment.objects.count() == 1


def test_the_runs_table_has_steps_duration_step_time_and_final_reward(alice_client, alice_run):
    store_metrics(alice_run)  # timing_s/step 1.0, 2.0; reward/mean 0.0, 0.25
    page = alice_client.get(f"/experiments/{alice_run.experiment_id}/")
    run = page.context["runs"][0]
    # the same figures as the runs list's (compare.step_figures): these three show here
    assert {k: run.figures[k] for k in ("steps_done", "final_reward", "step_s")} == {
        "steps_done": 2, "final_reward": 0.25, "step_s": 1.5}
    assert set(run.figures) == {"steps_done", "final_reward", "step_s", "reward_ema", "learner_idle", "staleness"}
    html = page.content.decode()
    assert "2 / 2" in html and "1.500 s" in html and "0.250" in html


def test_the_schedule_select_defaults_to_streaming_without_a_blank(alice_client, alice_experiment, sync_preset,
                                                                    streaming_preset):
    form = alice_client.get(f"/experiments/{alice_experiment.pk}/").context["launch_form"]
    assert form["schedule"].value() == streaming_preset.pk
    assert "---------" not in str(form["schedule"])


def test_schedules_are_created_edited_and_deleted_in_the_ui(alice_client, alice, sync_preset):
    response = alice_client.post("/schedules/", {"name": "stale-2", "kind": "fully-async", "knobs": '{"max_staleness": 2}'})
    mine = Schedule.objects.get(owner=alice)
    assert response.status_code == 302 and mine.knobs == {"max_staleness": 2}
    bad = alice_client.post(f"/schedules/{mine.pk}/edit/", {"name": "stale-2", "kind": "fully-async",
                                                            "knobs": '{"max_staleness": -1}'})
    assert bad.status_code == 400 and "max_staleness" in bad.context["form"].errors["knobs"][0]
    alice_client.post(f"/schedules/{mine.pk}/edit/", {"name": "stale-3", "kind": "fully-async", "knobs": '{"max_staleness": 3}'})
    mine.refresh_from_db()
    assert (mine.name, mine.knobs) == ("stale-3", {"max_staleness": 3})
    assert alice_client.post(f"/schedules/{sync_preset.pk}/edit/", {"name": "x", "kind": "sync"}).status_code == 404
    alice_client.post(f"/schedules/{mine.pk}/delete/")
    assert not Schedule.objects.filter(owner=alice).exists()


def test_a_schedule_used_by_runs_is_kept(alice_client, alice, alice_experiment):
    mine = Schedule.objects.create(owner=alice, name="mine", kind="sync")
    make_run(alice_experiment, mine)
    alice_client.post(f"/schedules/{mine.pk}/delete/")
    assert Schedule.objects.filter(pk=mine.pk).exists()


def test_the_favicon_is_linked_and_served(alice_client):
    assert 'rel="icon"' in alice_client.get("/").content.decode()
    assert alice_client.get("/favicon.ico")["Location"] == "/static/favicon.svg"


def test_yaml_text_posted_to_the_api_is_kept_as_written(alice_client):
    from .conftest import post_json

    response = post_json(alice_client, "/api/experiments/", {"name": "api", "config": WRITTEN})
    assert response.status_code == 201
    assert Experiment.objects.get(name="api").config_yaml() == WRITTEN


def test_a_config_changed_elsewhere_is_shown_as_stored_not_as_the_stale_text(alice_experiment):
    alice_experiment.config_text = WRITTEN  # says steps: 3, group_size: 4; the stored config differs
    assert "# keep it short" not in alice_experiment.config_yaml()
    assert "builtin:tiny" in alice_experiment.config_yaml()
