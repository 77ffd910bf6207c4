"""The web app launches each runnable example config through the real path: API -> Redis ->
Celery worker -> `thundersync train` in the run's directory -> PostgreSQL. (The GPU recipe,
configs/chat-model-gpu.yaml, needs a model directory and a GPU: documented, not run here.)"""

from pathlib import Path

import pytest
import yaml
from django.conf import settings

from controller.models import Experiment, StepMetric

from .conftest import ROOT, post_json, wait_for_status

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
FINISHED = {"succeeded", "failed", "cancelled"}


@pytest.mark.parametrize("name", ["jsonl-math", "reasoning-gym", "lora"])
def test_the_web_app_launches_an_example_config(celery_worker, alice, alice_client, streaming_preset, name):
    config = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    experiment = Experiment.objects.create(owner=alice, name=name, config=config)
    response = post_json(alice_client, "/api/runs/", {"experiment": experiment.pk, "schedule": streaming_preset.pk,
                                                      "steps": 1})
    assert response.status_code == 201, response.content
    run = wait_for_status(response.json()["id"], FINISHED, timeout=400)
    assert run.status == "succeeded", run.error
    [step] = StepMetric.objects.filter(run=run)
    assert "reward/mean" in step.values and "memory/grad_buffers_mb" in step.values
    if name != "lora":
        assert step.values["task/reward_errors"] == 0.0  # data tasks: every reward scored
    else:  # the adapter and the merged model, in the run's own directory
        out = Path(settings.THUNDERSYNC_RUN_DIR) / f"run-{run.pk}" / config["train"]["output_dir"]
        assert (out / "adapter_config.json").is_file() and (out / "merged" / "config.json").is_file()
