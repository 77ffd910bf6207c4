"""Trajectory records: validating the learner's ``{"type": "trajectory"}`` events
(learner/driver/trajectory_records.py) and the JSON API that reads them back
(``GET /api/runs/<id>/trajectories/?step=``, ``GET /api/runs/<id>/trajectories/<traj>/``)."""

import json
import math

from django.http import JsonResponse
from django.shortcuts import get_object_or_404

from controller.jsonapi.api_errors import ApiError
from controller.jsonapi.decorators import api_view, int_param
from controller.limits.limits import INT32_MAX
from controller.models import Run, TrajectoryRecord

ROLES = ("prompt", "turn", "observation")
MAX_SEGMENTS_BYTES = 64 * 1024  # the learner keeps a trajectory's text near 16,000 characters
SUMMARY_FIELDS = ("step", "traj", "group", "reward", "advantage", "zero_gradient", "turns", "tokens", "drafted",
                  "error", "versions")


def int32(event: dict, name: str) -> int:
    value = event.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not -(2**31) <= value < 2**31:
        raise ValueError(f"trajectory.{name}: expected a 32-bit integer")
    return value


def finite(value, name: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"trajectory.{name}: expected a finite number{' or null' if optional else ''}")
    return float(value)


def checked_segments(value) -> list:
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise ValueError("trajectory.segments: expected a list of objects")
    for k, seg in enumerate(value):
        if seg.get("role") not in ROLES or not isinstance(seg.get("text"), str):
            raise ValueError(f"trajectory.segments[{k}]: expected a role ({', '.join(ROLES)}) and a text")
    if len(json.dumps(value)) > MAX_SEGMENTS_BYTES:
        raise ValueError(f"trajectory.segments: over {MAX_SEGMENTS_BYTES} bytes")
    return value


def record_from_event(run_id: int, event: dict) -> TrajectoryRecord:
    """Validate one trajectory event; raises ValueError naming the bad field."""
    versions = event.get("versions", [])
    if not isinstance(versions, list) or not all(isinstance(v, int) for v in versions):
        raise ValueError("trajectory.versions: expected a list of integers")
    error = event.get("error") or ""
    if not isinstance(error, str):
        raise ValueError("trajectory.error: expected a string or null")
    return TrajectoryRecord(
        run_id=run_id, step=int32(event, "step"), traj=int32(event, "traj"), group=int32(event, "group"),
        reward=finite(event.get("reward"), "reward"), advantage=finite(event.get("advantage"), "advantage", True),
        zero_gradient=bool(event.get("zero_gradient")), turns=int32(event, "turns"), tokens=int32(event, "tokens"),
        drafted=bool(event.get("drafted")), error=error[:2000], versions=versions,
        segments=checked_segments(event.get("segments", [])),
    )


def summary_json(rec: TrajectoryRecord) -> dict:
    return {name: getattr(rec, name) for name in SUMMARY_FIELDS}


def owned(user, run_id: int) -> Run:
    return get_object_or_404(Run, pk=run_id, experiment__owner=user)


@api_view("GET")
def run_trajectories(request, run_id: int):
    """A step's trajectories without their text (``step`` required: a run holds thousands)."""
    run = owned(request.user, run_id)
    step = int_param(request, "step", None, 0, INT32_MAX)
    if step is None:
        raise ApiError(400, {"step": "required: the step whose trajectories to list"})
    rows = TrajectoryRecord.objects.filter(run=run, step=step).defer("segments")
    return JsonResponse({"step": step, "trajectories": [summary_json(r) for r in rows]})


@api_view("GET")
def run_trajectory(request, run_id: int, traj: int):
    """One trajectory with its decoded text; 404 naming it when the learner recorded none."""
    run = owned(request.user, run_id)
    rec = TrajectoryRecord.objects.filter(run=run, traj=traj).first()
    if rec is None:
        raise ApiError(404, {"traj": f"no record of trajectory {traj} in run {run.pk} (yet)"})
    return JsonResponse({**summary_json(rec), "segments": rec.segments})
