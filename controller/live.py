"""Frames for the live run page, sent through the channel layer to group ``run_<id>``."""

import json
import logging
import time

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)
_outage: dict[str, float] = {}  # "since": when publishing started to fail


def group_name(run_id: int) -> str:
    return f"run_{run_id}"


def publish(run_id: int, frame: dict) -> None:
    """Send one frame to every open page of the run. Best effort: the database is the
    source of truth and a client that misses a frame catches up from it.

    The frame is JSON-encoded here, once for all viewers; a spans frame (seq-ordered) also
    carries its first and last seq, which is all a consumer needs to forward it or fill a gap."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "run.frame", "text": json.dumps(frame)}
    if frame["type"] == "spans" and frame["spans"]:
        message.update(first_seq=frame["spans"][0]["seq"], last_seq=frame["spans"][-1]["seq"])
    try:
        async_to_sync(layer.group_send)(group_name(run_id), message)
    except Exception as err:  # a channel layer outage must not fail the training run
        if _outage.get("since") is None:  # one warning per outage, not a traceback per frame
            _outage["since"] = time.monotonic()
            log.warning("run %s: the channel layer is unreachable (%s); live frames are dropped until it is "
                        "back, pages catch up from the database", run_id, err)
        return
    if _outage.get("since") is not None:
        log.warning("the channel layer is back after %.1fs", time.monotonic() - _outage.pop("since"))
