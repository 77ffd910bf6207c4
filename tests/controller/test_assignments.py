"""fully-async's assignment events: the ingestor re-tags the trained trajectories' rollout spans
(stored or still buffered) with the step that took them; a bad event is refused naming its field."""

import json

import pytest

from controller.ingest.ingestion import RunIngestor
from controller.models import Span

from .test_ingestion import span_line

pytestmark = pytest.mark.django_db


def rollout_line(seq, traj, version=0):
    return span_line(seq, step=-1, kind="rollout.generate", lane="rollout/0/0", traj=traj, policy_version=version)


def assignment_line(step, trajs):
    return json.dumps({"type": "assignment", "step": step, "trajs": trajs})


def steps_by_traj(run):
    return {t: sorted(set(Span.objects.filter(run=run, traj=t).values_list("step", flat=True))) for t in range(4)}


def test_stored_and_buffered_rollout_spans_take_their_step_and_keep_their_version(alice_run):
    ing = RunIngestor(alice_run.pk, flush_s=60.0, flush_spans=500)
    for seq, traj in enumerate([0, 1, 2, 3]):  # rolled out under version 0, none taken yet
        ing.feed(rollout_line(seq, traj))
    ing.flush()
    ing.feed(rollout_line(4, 1))  # still buffered when the step takes trajectory 1
    ing.feed(assignment_line(0, [0, 1]))
    ing.feed(span_line(5, step=0, traj=0))  # the step's backward
    ing.flush()
    assert steps_by_traj(alice_run) == {0: [0], 1: [0], 2: [-1], 3: [-1]}
    ing.feed(assignment_line(1, [2]))  # trajectory 3 never taken: its group was dropped
    ing.flush()
    assert steps_by_traj(alice_run) == {0: [0], 1: [0], 2: [1], 3: [-1]}
    assert set(Span.objects.filter(run=alice_run, kind="rollout.generate").values_list("policy_version", flat=True)) == {0}
    assert ing.rejected == []


@pytest.mark.parametrize("event, field", [
    ({"step": -1, "trajs": [1]}, "assignment.step"),
    ({"step": True, "trajs": [1]}, "assignment.step"),
    ({"step": 2, "trajs": "1,2"}, "assignment.trajs"),
    ({"step": 2, "trajs": [1, 2**31]}, "assignment.trajs"),
])
def test_a_bad_assignment_is_refused_naming_its_field_and_nothing_is_retagged(alice_run, event, field):
    ing = RunIngestor(alice_run.pk, flush_s=60.0, flush_spans=500)
    ing.feed(rollout_line(0, 1))
    ing.feed(json.dumps({"type": "assignment", **event}))
    ing.flush()
    assert len(ing.rejected) == 1 and ing.rejected[0].startswith(field + ":")
    assert steps_by_traj(alice_run)[1] == [-1]
