"""Every websocket frame the run page receives is built here (docs/web-contract.md,
"Websocket"): the ingestor and the consumer only decide when to send which."""

from .models import Run


def spans_frame(spans: list[dict]) -> dict:
    """Spans in seq order, each with the fields of ``serializers.SPAN_FIELDS``."""
    return {"type": "spans", "spans": spans}


def metrics_frame(metrics: list[dict]) -> dict:
    """Per-step metrics: ``[{"step": int, "values": {name: number}}]`` in step order."""
    return {"type": "metrics", "metrics": metrics}


def status_frame(run: Run) -> dict:
    return {"type": "status", "status": run.status, "summary": run.summary, "error": run.error,
            "resumable": run.status in Run.RESUMABLE and run.checkpoints.exists()}


def replay_done_frame(last_seq: int) -> dict:
    """The replay of stored spans is over; live frames follow."""
    return {"type": "replay_done", "last_seq": last_seq}
