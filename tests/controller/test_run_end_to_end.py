"""Real runs: API -> Redis broker -> Celery worker -> `thundersync train` child -> PostgreSQL
and the channel layer -> websocket. Each test trains (or starts) the tiny built-in model
from configs/quickstart.yaml, so they are marked slow; CI runs them.
"""

import json
import os

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from controller.asgi import application
from controller.models import Experiment, Run, Span, StepMetric, TrajectoryRecord

from .conftest import QUICKSTART, post_json, wait_for_status
from .test_consumers import session_headers

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
FINISHED = {"succeeded", "failed", "cancelled"}


def launch(client, experiment, schedule, steps):
    response = post_json(client, "/api/runs/", {"experiment": experiment.pk, "schedule": schedule.pk, "steps": steps})
    assert response.status_code == 201, response.content
    return response.json()["id"]


async def test_a_launched_run_trains_and_streams_every_span_once(
    celery_worker, alice, alice_client, alice_experiment, streaming_preset
):
    run_id = await database_sync_to_async(launch)(alice_client, alice_experiment, streaming_preset, 1)
    headers = await database_sync_to_async(session_headers)(alice)
    page = WebsocketCommunicator(application, f"/ws/runs/{run_id}/", headers=headers)
    assert (await page.connect(timeout=60))[0]
    frames = [await page.receive_json_from(timeout=60)]
    while not (frames[-1]["type"] == "status" and frames[-1]["status"] in FINISHED):
        frames.append(await page.receive_json_from(timeout=240))
    await page.disconnect()

    run = await database_sync_to_async(Run.objects.get)(pk=run_id)
    assert run.status == "succeeded", run.error
    stored = await database_sync_to_async(lambda: list(Span.objects.filter(run_id=run_id).values_list("seq", flat=True)))()
    streamed = [s["seq"] for f in frames if f["type"] == "spans" for s in f["spans"]]
    assert streamed == sorted(stored) == list(range(len(stored)))  # replay + live: each span once, in order
    assert run.summary["spans"] == len(stored)  # the learner's own count agrees with what was ingested
    assert run.summary["steps"] == 1 and 0.0 <= run.summary["mean/trainer/idle_ratio"] <= 1.0
    assert {"learner.backward", "rollout.generate"} <= {s["kind"] for f in frames if f["type"] == "spans"
                                                        for s in f["spans"]}
    metrics = await database_sync_to_async(lambda: list(StepMetric.objects.filter(run_id=run_id)))()
    assert [m.step for m in metrics] == [0] and "timing_s/step" in metrics[0].values
    # every trajectory's record, with its text, came through the same stream before the end
    records = await database_sync_to_async(lambda: list(TrajectoryRecord.objects.filter(run_id=run_id)))()
    trained = {s["traj"] for f in frames if f["type"] == "spans" for s in f["spans"] if s["kind"] == "rollout.verify"}
    assert {r.traj for r in records} == trained and all(r.segments[0]["role"] == "prompt" for r in records)
    assert {"type": "trajectories", "steps": [0]} in frames  # the page is told when they are stored
    statuses = [f["status"] for f in frames if f["type"] == "status"]
    assert statuses[-1] == "succeeded" and "running" in statuses

    def export() -> bytes:  # streamed from a server-side cursor (controller/exports.py): read it off the loop
        return b"".join(alice_client.get(f"/api/runs/{run_id}/trace.json").streaming_content)

    trace = json.loads(await database_sync_to_async(export)())
    assert sum(1 for e in trace["traceEvents"] if e["ph"] == "X") == len(stored)


def test_cancel_stops_the_whole_process_group(celery_worker, alice_client, alice_experiment, streaming_preset):
    run_id = launch(alice_client, alice_experiment, streaming_preset, 500)
    running = wait_for_status(run_id, {"running"} | FINISHED, timeout=240)
    assert running.status == "running", running.error
    assert alice_client.post(f"/api/runs/{run_id}/cancel/").status_code == 202
    cancelled = wait_for_status(run_id, FINISHED, timeout=60)
    assert cancelled.status == "cancelled" and cancelled.finished is not None
    leader = cancelled.pids[0]
    with pytest.raises(ProcessLookupError):  # nothing of the learner's process group is left
        os.killpg(leader, 0)


def test_a_learner_failure_is_recorded_with_its_reason(celery_worker, alice, alice_client, streaming_preset,
                                                       settings, tmp_path):
    settings.THUNDERSYNC_MODEL_ROOTS = [str(tmp_path)]  # allowed by the server, yet no model is there
    missing = str(tmp_path / "nonexistent-model")
    broken = Experiment.objects.create(
        owner=alice, name="broken", config={**QUICKSTART, "model": {"policy": missing}}
    )
    run_id = launch(alice_client, broken, streaming_preset, 1)
    failed = wait_for_status(run_id, FINISHED, timeout=240)
    assert failed.status == "failed"
    # The reason comes from the learner (its failed event, or its exit code and message),
    # whichever layer of the learner rejects the model path.
    assert repr(missing) in failed.error
    assert "last stderr lines:\n" in failed.error
