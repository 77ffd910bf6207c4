"""Every websocket frame the run page receives is built here (docs/web-contract.md,
"Websocket"): the ingestor and the consumer only decide when to send which."""

from controller.models import Run
from controller.jsonapi.serializers import iso


def spans_frame(spans: list[dict]) -> dict:
    """Spans in seq order, each with the fields of ``serializers.SPAN_FIELDS``."""
    return {"type": "spans", "spans": spans}


def metrics_frame(metrics: list[dict]) -> dict:
    """Per-step metrics: ``[{"step": int, "values": {name: number}}]`` in step order."""
    return {"type": "metrics", "metrics": metrics}


def system_frame(samples: list[dict]) -> dict:
    """Process samples on the wall clock: ``[{"t": run clock s, "node": str, "values": {name: number}}]`` in t order."""
    return {"type": "system", "samples": samples}


def status_frame(run: Run) -> dict:
    return {"type": "status", "status": run.status, "summary": run.summary, "error": run.error,
            "started": iso(run.started), "finished": iso(run.finished),
            "resumable": run.status in Run.RESUMABLE and run.checkpoints.exists()}


def log_frame(first: int, lines: list[str]) -> dict:
    """New lines of the run's log, the first of them line number ``first``."""
    return {"type": "log", "first": first, "lines": lines}


def trajectories_frame(steps: list[int]) -> dict:
    """The learner's trajectory records of these steps are stored (``GET /api/runs/<id>/trajectories/``)."""
    return {"type": "trajectories", "steps": steps}


def assignment_frame(step: int, trajs: list[int]) -> dict:
    """fully-async: these trajectories' rollout spans, sent with step -1, now belong to ``step``
    (the database has them so: controller/ingest/assignments.py)."""
    return {"type": "assignment", "step": step, "trajs": trajs}


def replay_done_frame(last_seq: int) -> dict:
    """The replay of stored spans is over; live frames follow."""
    return {"type": "replay_done", "last_seq": last_seq}
