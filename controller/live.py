"""Frames for the live run page, sent through the channel layer to group ``run_<id>``."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)


def group_name(run_id: int) -> str:
    return f"run_{run_id}"


def publish(run_id: int, frame: dict) -> None:
    """Send one frame to every open page of the run. Best effort: the database is the
    source of truth and a client that misses a frame catches up from it."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group_name(run_id), {"type": "run.frame", "frame": frame})
    except Exception:  # a channel layer outage must not fail the training run
        log.warning("run %s: could not publish a %s frame", run_id, frame.get("type"), exc_info=True)
