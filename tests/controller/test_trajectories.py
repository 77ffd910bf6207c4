"""The learner's trajectory records: ingested from the event stream, read back by the API (a
step's list without text, one with its segments), bad events refused naming the field."""

import json

import pytest

from controller.ingest.ingestion import RunIngestor
from controller.models import TrajectoryRecord

pytestmark = pytest.mark.django_db


def record_event(traj, step=0, **fields):
    return {"type": "trajectory", "step": step, "traj": traj, "group": traj // 2, "reward": float(traj % 2),
            "advantage": 0.7 if traj % 2 else -0.7, "zero_gradient": False, "turns": 2, "tokens": 9,
            "versions": [0, 0], "drafted": False, "error": None,
            "segments": [{"role": "prompt", "text": "What is 2+3?", "tokens": 5, "cut": False},
                         {"role": "turn", "text": "<call>2+3</call>", "tokens": 6, "cut": False, "turn": 0,
                          "version": 0, "tool_call": True},
                         {"role": "observation", "text": "5", "tokens": 1, "cut": False, "turn": 0}],
            **fields}


def fed(run, events):
    ing = RunIngestor(run.pk, flush_s=60.0, flush_spans=500)
    for event in events:
        ing.feed(json.dumps(event))
    ing.flush()
    return ing


def test_records_are_stored_idempotently_and_listed_per_step(alice_run, alice_client):
    fed(alice_run, [record_event(t) for t in range(4)] + [record_event(4, step=1)])
    fed(alice_run, [record_event(0, reward=0.25)])  # a resumed run sends it again: replaced
    assert TrajectoryRecord.objects.filter(run=alice_run).count() == 5
    body = alice_client.get(f"/api/runs/{alice_run.pk}/trajectories/?step=0").json()
    assert [t["traj"] for t in body["trajectories"]] == [0, 1, 2, 3]
    assert body["trajectories"][0]["reward"] == 0.25 and "segments" not in body["trajectories"][0]
    one = alice_client.get(f"/api/runs/{alice_run.pk}/trajectories/1/").json()
    assert one["advantage"] == 0.7 and [s["role"] for s in one["segments"]] == ["prompt", "turn", "observation"]
    assert one["segments"][1]["tool_call"] is True and one["segments"][0]["text"] == "What is 2+3?"


def test_missing_and_foreign_records_answer_404_and_a_step_is_required(alice_run, alice_client, bob_client):
    fed(alice_run, [record_event(0)])
    missing = alice_client.get(f"/api/runs/{alice_run.pk}/trajectories/99/")
    assert missing.status_code == 404 and "trajectory 99" in missing.json()["errors"]["traj"]
    assert bob_client.get(f"/api/runs/{alice_run.pk}/trajectories/0/").status_code == 404
    no_step = alice_client.get(f"/api/runs/{alice_run.pk}/trajectories/")
    assert no_step.status_code == 400 and "step" in no_step.json()["errors"]


@pytest.mark.parametrize("bad, field", [
    ({"reward": float("nan")}, "trajectory.reward"), ({"traj": "7"}, "trajectory.traj"),
    ({"segments": [{"role": "tool", "text": "x"}]}, "trajectory.segments[0]"),
    ({"segments": [{"role": "prompt", "text": "x" * 70_000}]}, "trajectory.segments"),
])
def test_a_bad_record_is_refused_naming_its_field(alice_run, bad, field):
    ing = fed(alice_run, [{**record_event(0), **bad}])
    assert TrajectoryRecord.objects.filter(run=alice_run).count() == 0
    assert ing.rejected and ing.rejected[0].startswith(field)


@pytest.mark.parametrize("vendor", ["postgresql", "sqlite"])
def test_both_record_writes_store_every_field_and_replace_a_stored_trajectory(alice_run, vendor, monkeypatch):
    """The PostgreSQL array upsert and the bulk_create elsewhere store the same records (JSON,
    nulls, booleans and text with quotes included); a record sent again replaces the first."""
    from controller.ingest import bulk_writes
    from controller.trajectories import record_from_event

    if vendor == "sqlite":  # the test database is PostgreSQL: take the other branch on it
        monkeypatch.setattr(bulk_writes.connection, "vendor", "sqlite")
    events = [record_event(t, advantage=None if t == 2 else 0.5, error='a "quoted" {error}' if t == 1 else None)
              for t in range(3)]
    bulk_writes.write_trajectories([record_from_event(alice_run.pk, e) for e in events])
    again = record_event(1, reward=0.75, zero_gradient=True, segments=[{"role": "prompt", "text": "ünïcode ' \\ "}])
    bulk_writes.write_trajectories([record_from_event(alice_run.pk, again)])
    stored = {r.traj: r for r in TrajectoryRecord.objects.filter(run=alice_run)}
    assert sorted(stored) == [0, 1, 2]
    assert stored[2].advantage is None and stored[0].advantage == 0.5 and stored[0].segments == events[0]["segments"]
    assert (stored[1].reward, stored[1].zero_gradient, stored[1].error) == (0.75, True, "")
    assert stored[1].segments == [{"role": "prompt", "text": "ünïcode ' \\ "}] and stored[0].versions == [0, 0]
