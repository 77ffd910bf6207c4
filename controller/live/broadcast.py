"""Frames for the live run page, sent through the channel layer to group ``run_<id>``."""

import asyncio
import concurrent.futures
import json
import logging
import os
import threading
import time

from channels.layers import get_channel_layer

from controller.supervision.priority import yield_to_runs

log = logging.getLogger(__name__)
_outage: dict[str, float] = {}  # "since": when publishing started to fail
_dropped: set[int] = set()  # runs whose frames were dropped since then: their pages resume once it is back
PUBLISH_TIMEOUT_S = 5.0
_publisher: dict = {}  # this process's publishing event loop: {"pid", "loop"}
_publisher_lock = threading.Lock()


def _publisher_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, in a thread of its own, for every publish. The channel
    layer keeps its Redis connections per event loop: ``async_to_sync`` made a new loop, and so
    a new connection, for every frame (4.4 ms median, p95 34 ms at load 20, against 1.0 / 1.6 ms
    on a kept loop; bench/web/live_latency.py, docs/bench-web.md)."""
    with _publisher_lock:
        if _publisher.get("pid") != os.getpid():  # first use, or a forked child (a Celery pool process)
            loop = asyncio.new_event_loop()
            threading.Thread(target=_serve, args=(loop,), name="live-publisher", daemon=True).start()
            _publisher.update(pid=os.getpid(), loop=loop)
        return _publisher["loop"]


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    yield_to_runs()  # frames are best effort: the run being published comes first (controller/supervision/priority.py)
    loop.run_forever()


def _group_send(layer, group: str, message: dict) -> None:
    future = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _publisher_loop())
    try:
        future.result(timeout=PUBLISH_TIMEOUT_S)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the channel layer did not answer within {PUBLISH_TIMEOUT_S:g}s") from None


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
        _group_send(layer, group_name(run_id), message)
        for dropped in list(_dropped):  # pages that missed frames (a status, metrics) reconnect and replay them
            _group_send(layer, group_name(dropped), {"type": "run.resync"})
            _dropped.discard(dropped)
    except Exception as err:  # a channel layer outage must not fail the training run
        _dropped.add(run_id)
        if _outage.get("since") is None:  # one warning per outage, not a traceback per frame
            _outage["since"] = time.monotonic()
            log.warning("run %s: the channel layer is unreachable (%s); live frames are dropped until it is "
                        "back, pages catch up from the database", run_id, err)
        return
    if _outage.get("since") is not None:
        log.warning("the channel layer is back after %.1fs", time.monotonic() - _outage.pop("since"))
