"""Resume a failed or cancelled run from its checkpoint (controller/supervision/resuming.py): the API,
the page's button, the learner arguments of the new attempt, the reaper's auto-resume."""

import json

import pytest
import torch
from django.utils import timezone

from controller.supervision import ownership
from learner.checkpoint import RunState, save_checkpoint
from controller.models import Checkpoint, Run
from controller.supervision.resuming import commit_point, resume_arguments
from controller.supervision.supervisor import supervise
from learner.checkpoint_integrity import newest_intact

from .conftest import make_run, store_spans
from .test_ownership import dead_local_supervisor

pytestmark = pytest.mark.django_db
URL = "/api/runs/"


def with_checkpoint(run: Run, step: int = 1) -> Run:
    Checkpoint.objects.create(run=run, step=step, path=f"output/checkpoints/step-{step:06d}")
    return run


def test_it_resumes_a_failed_run_with_a_checkpoint_as_its_next_attempt(alice_client, alice_experiment, sync_preset):
    run = with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.FAILED, error="boom",
                                   finished=timezone.now()))
    response = alice_client.post(f"{URL}{run.pk}/resume/")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status"] == "queued" and body["attempt"] == 1 and body["error"] == "" and body["checkpoints"] == [1]


@pytest.mark.parametrize("status, has_checkpoint, reason", [
    (Run.Status.SUCCEEDED, True, "only a failed or cancelled run can be resumed"),
    (Run.Status.RUNNING, True, "only a failed or cancelled run can be resumed"),
    (Run.Status.FAILED, False, "wrote no checkpoint"),
])
def test_it_refuses_what_cannot_be_resumed(alice_client, alice_experiment, sync_preset, status, has_checkpoint,
                                           reason):
    run = make_run(alice_experiment, sync_preset, status=status, heartbeat=timezone.now(), supervisor="other:1:1")
    if has_checkpoint:
        with_checkpoint(run)
    response = alice_client.post(f"{URL}{run.pk}/resume/")
    assert response.status_code == 409 and reason in response.json()["errors"]["status"]
    run.refresh_from_db()
    assert run.status == status and run.attempt == 0


def test_it_rejects_other_users_run(bob_client, alice_experiment, sync_preset):
    run = with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.FAILED))
    assert bob_client.post(f"{URL}{run.pk}/resume/").status_code == 404


def test_the_run_page_offers_resume_only_when_it_can(alice_client, alice_experiment, sync_preset):
    failed = with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.FAILED), step=3)
    page = alice_client.get(f"/runs/{failed.pk}/").content.decode()
    assert 'id="resume-form"' in page and 'id="resume-form" hidden' not in page.replace("\n", " ")
    assert "Checkpoints after step 3" in page
    bare = make_run(alice_experiment, sync_preset, status=Run.Status.FAILED)
    assert "hidden" in alice_client.get(f"/runs/{bare.pk}/").content.decode().split('id="resume-form"')[1][:200]
    response = alice_client.post(f"/runs/{failed.pk}/resume/")
    assert response.status_code == 302
    failed.refresh_from_db()
    assert failed.status == "queued" and failed.attempt == 1


def test_a_resumed_attempt_continues_the_span_numbering_and_the_clock(alice_experiment, sync_preset, settings,
                                                                      tmp_path):
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING, attempt=1)
    store_spans(run, 10)  # seq 0..9, the last ending at t = 0.95
    args = resume_arguments(run, tmp_path / f"run-{run.pk}")
    assert args == ["--resume", str(tmp_path / f"run-{run.pk}" / "output"), "--seq-from", "10",
                    "--clock-from", repr(0.1 * 9 + 0.05)]
    # the supervisor starts the learner with them (a shell stands in for it and echoes them)
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    finished = json.dumps({"type": "run", "status": "finished", "summary": {"wall_s": 0.1}})
    settings.THUNDERSYNC_LEARNER_COMMAND = ["sh", "-c", f'echo "$*" >&2; echo \'{finished}\'', "learner"]
    done = supervise(run)
    assert done.status == "succeeded", done.error
    logged = (tmp_path / f"run-{run.pk}" / "learner.stderr.log").read_text()
    assert logged.startswith(f"train --resume {tmp_path / f'run-{run.pk}' / 'output'} --seq-from 10")


def test_the_reaper_resumes_a_supervisorless_run_that_has_a_checkpoint(alice_experiment, sync_preset, settings):
    run = with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING,
                                   supervisor=dead_local_supervisor(), heartbeat=timezone.now()))
    assert ownership.reap()[0] == 1
    run.refresh_from_db()
    assert run.status == "queued" and run.attempt == 1
    Run.objects.filter(pk=run.pk).update(status=Run.Status.RUNNING, supervisor=dead_local_supervisor(),
                                         attempt=settings.THUNDERSYNC_AUTO_RESUMES)
    ownership.reap()
    run.refresh_from_db()
    assert run.status == "failed" and "not resumed again after 2 attempts" in run.error


def write_checkpoint(run_dir, step: int):
    """A real (tiny) committed checkpoint of the boundary after ``step``."""
    model = torch.nn.Linear(2, 1)
    state = RunState(steps_done=step + 1, version=step + 1, seq=0, clock=0.0, next_traj=0, next_group=0)
    return save_checkpoint(run_dir / "output", model, torch.optim.AdamW(model.parameters()), state, keep=100)


def test_the_resume_point_is_the_newest_checkpoint_the_database_acknowledged(alice_experiment, sync_preset, tmp_path):
    run = with_checkpoint(with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED), 1), 3)
    kept = [write_checkpoint(tmp_path, s) for s in (1, 3)]
    unrecorded = write_checkpoint(tmp_path, 5)  # written after the learner's SIGTERM; its report never stored
    half = tmp_path / "output" / "checkpoints" / ".tmp-step-000007-4242"
    half.mkdir()
    torn = write_checkpoint(tmp_path, 2)
    (torn / "state.json").write_text("")  # not the size committed: not a checkpoint
    commit_point(run, tmp_path)
    assert all(p.exists() for p in kept) and not unrecorded.exists() and not half.exists() and not torn.exists()


def test_without_an_acknowledged_checkpoint_on_disk_the_disks_own_are_kept(alice_experiment, sync_preset, tmp_path):
    run = with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED), 1)  # pruned since
    newer = write_checkpoint(tmp_path, 5)
    commit_point(run, tmp_path)
    assert newer.exists()


def test_a_damaged_acknowledged_checkpoint_is_not_the_resume_point(alice_experiment, sync_preset, tmp_path):
    """Step 3's model overwritten at the same size: step 1 is the newest intact acknowledged
    one; step 3 is left for the learner to set aside and name, the unrecorded step 5 removed."""
    run = with_checkpoint(with_checkpoint(make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED), 1), 3)
    first, damaged, unrecorded = (write_checkpoint(tmp_path, s) for s in (1, 3, 5))
    with open(damaged / "model.safetensors", "r+b") as fh:
        fh.seek(-16, 2)
        fh.write(b"\0" * 16)
    commit_point(run, tmp_path)
    assert first.exists() and damaged.exists() and not unrecorded.exists()
    assert newest_intact(tmp_path / "output", lambda line: None) == first
