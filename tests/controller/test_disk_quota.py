"""Disk per user (controller/limits/disk_quota.py): a launch that would pass the quota is refused
with what is used and what the run may write; a run that outgrows it is stopped, saying so."""

import json
import os
import time

import pytest

from controller.models import Run, UserQuota
from controller.supervision.runlog import run_dir
from controller.supervision.supervisor import supervise

from .conftest import make_run, post_json

pytestmark = pytest.mark.django_db
STARTED = json.dumps({"type": "run", "status": "started", "config": {}, "t": 0.0})


def test_a_launch_over_the_disk_quota_says_what_is_used_and_is_not_stored(alice, alice_client, alice_experiment,
                                                                         sync_preset, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    UserQuota.objects.create(user=alice, disk_mb=5)
    old = make_run(alice_experiment, sync_preset)
    run_dir(old.pk).mkdir(parents=True)
    (run_dir(old.pk) / "model.safetensors").write_bytes(os.urandom(2 * 2**20))
    launch = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk}
    refused = post_json(alice_client, "/api/runs/", launch)
    assert refused.status_code == 400
    assert refused.json()["errors"]["disk"] == (
        "your runs use 2 MB and this run may write 4 MB (the final policy), over your disk quota of 5 MB: "
        "delete runs you no longer need")
    assert Run.objects.count() == 1
    (run_dir(old.pk) / "model.safetensors").unlink()
    assert post_json(alice_client, "/api/runs/", launch).status_code == 201


def test_a_run_that_outgrows_the_disk_quota_is_stopped_with_its_reason(alice, alice_experiment, sync_preset, settings,
                                                                       tmp_path):
    settings.THUNDERSYNC_RUN_DIR, settings.THUNDERSYNC_DISK_CHECK_S = tmp_path, 0.2
    UserQuota.objects.create(user=alice, disk_mb=1)
    # a "learner" that writes 3 MB into its run directory, then keeps going
    settings.THUNDERSYNC_LEARNER_COMMAND = [
        "sh", "-c", f"echo '{STARTED}'; head -c 3145728 /dev/zero > grown.bin; sleep 300 & wait", "learner"]
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    started = time.monotonic()
    finished = supervise(run)
    assert finished.status == "failed" and time.monotonic() - started < 30
    assert finished.error.splitlines()[0] == "disk quota: your runs hold 3 MB, over your quota of 1 MB"
