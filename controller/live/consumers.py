"""The live run page's websocket: replay from the database, then live frames.

Protocol (docs/web-contract.md): connect to /ws/runs/<id>/?after=<seq>; the server replays
every stored span with seq > after in batches, all metrics, the status and
``replay_done``, then forwards live frames; the client acknowledges the frames it has
received, which paces the replay and bounds what a slow viewer can leave buffered. Each
span is delivered exactly once: the consumer joins the run's group before it reads the
database, remembers the highest seq it sent, drops live spans at or below it, and reads a
gap (a dropped live frame) back from the database, which the ingestor always writes before
it publishes. Who may open such a socket, and the close codes of those turned away:
controller/live/socket_admission.py.
"""

import asyncio
import json
from collections import deque
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import DatabaseError

from controller.live import fanout
from controller.live import layer_groups
from controller.models import Run, Span
from controller.supervision.runlog import log_tail
from controller.live.frames import log_frame, metrics_frame, replay_done_frame, spans_frame, status_frame, system_frame
from controller.jsonapi.serializers import metrics_json, spans_json, system_json
from controller.live.socket_admission import CLOSE_BAD_REQUEST, CLOSE_NOT_FOUND, CLOSE_TOO_SLOW, AdmittedSocket

try:  # daphne's websocket protocol (autobahn) raises this on a send after the client went away
    from autobahn.exception import Disconnected as ClientGone
except ImportError:  # another ASGI server: nothing of this kind to catch
    class ClientGone(Exception):  # type: ignore[no-redef]
        pass

REPLAY_BATCH = 2000
MAX_CLIENT_FRAME_CHARS = 200  # {"type": "ack", "frames": n} is ~40 characters


@database_sync_to_async
def find_run(user, run_id: int) -> Run | None:
    return Run.objects.filter(pk=run_id, experiment__owner=user).first()


@database_sync_to_async
def stored_spans(run_id: int, after: int, through: int | None = None) -> list[dict]:
    spans = Span.objects.filter(run_id=run_id, seq__gt=after)
    if through is not None:
        spans = spans.filter(seq__lte=through)
    return spans_json(spans, REPLAY_BATCH)


@database_sync_to_async
def current_state(run_id: int) -> tuple[list[dict], list[dict], dict]:
    return metrics_json(run_id), system_json(run_id), status_frame(Run.objects.get(pk=run_id))


def after_param(query_string: bytes) -> int | None:
    values = parse_qs(query_string.decode("latin-1")).get("after", ["-1"])
    try:
        after = int(values[-1])
    except ValueError:
        return None
    return after if -1 <= after < 2**31 else None


def parse_ack(text: str | None) -> int | None:
    """n of a client's ``{"type": "ack", "frames": n}``, else None: longer than an ack can be
    (so a deeply nested frame is never parsed), not one JSON object, or n not a non-negative
    integer (``1e20``, ``true``, ``"5"``); the caller caps n at the frames it sent, so a fake
    ack cannot switch off the backpressure."""
    if not text or len(text) > MAX_CLIENT_FRAME_CHARS:
        return None
    try:
        message = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("type") != "ack":
        return None
    frames = message.get("frames")
    return frames if type(frames) is int and frames >= 0 else None


class RunConsumer(AdmittedSocket):
    """One viewer of one run, let in by ``AdmittedSocket`` (controller/live/socket_admission.py). Frames
    go out as text encoded once by the publisher (``live.publish``); every frame sent is counted,
    and the client acknowledges how many it has received (``{"type": "ack", "frames": n}``), so
    the server knows each socket's backlog: the replay is paced by it (it sends while less than
    half the limit is unacknowledged), and a viewer whose live backlog passes
    ``THUNDERSYNC_WS_BACKLOG_BYTES`` is closed with ``CLOSE_TOO_SLOW``; the page then reconnects
    with ``?after`` and reads the rest from the database (docs/controller-api.md, "Websocket")."""

    replaying = False
    live_error: Exception | None = None
    feed: "fanout.RunFeed | None" = None

    async def admitted(self, user) -> None:
        after = after_param(self.scope.get("query_string", b""))
        if after is None:
            await self.refuse(CLOSE_BAD_REQUEST)
            return
        try:
            run = await find_run(user, self.scope["url_route"]["kwargs"]["run_id"])
        except DatabaseError as err:  # an outage: "try again later", never a 500
            await self.refuse_for_now("database", err)
            return
        if run is None:  # missing or another user's: the same answer
            await self.refuse(CLOSE_NOT_FOUND)
            return
        self.run_id, self.sent_seq = run.pk, after
        self.limit = settings.THUNDERSYNC_WS_BACKLOG_BYTES
        self.frames_sent, self.unacked, self.backlog, self.replaying = 0, deque(), 0, True
        # live frames (controller/live/fanout.py) and the client's acks both move the replay: one at a time
        self.turn = asyncio.Lock()
        try:  # this process's membership of the run's group, shared by its viewers of the run
            self.feed = await fanout.subscribe(self, self.channel_layer, run.pk)
        except Exception as err:  # the channel layer is down: replay what is stored, then retry later
            self.live_error = err
        await self.accept()
        async with self.turn:
            await self.continue_replay()

    async def disconnect(self, code):
        await super().disconnect(code)
        if self.feed is not None:
            await fanout.unsubscribe(self, self.feed)

    async def send_frame(self, text: str) -> None:
        """Send one frame; a client that went away meanwhile (closed its tab mid-replay) ends
        this socket's sending quietly: its disconnect follows, and a traceback would say nothing."""
        if self.closing:
            return
        self.frames_sent += 1
        self.unacked.append((self.frames_sent, len(text)))
        self.backlog += len(text)
        try:
            await self.send(text_data=text)
        except ClientGone:
            self.closing = True

    async def receive(self, text_data=None, bytes_data=None):
        if not hasattr(self, "unacked"):  # a refused socket
            return
        acked = parse_ack(text_data)
        if acked is None:
            return  # the page sends nothing else; anything malformed or impossible is ignored
        acked = min(acked, self.frames_sent)
        while acked is not None and self.unacked and self.unacked[0][0] <= acked:
            self.backlog -= self.unacked.popleft()[1]
        if self.replaying and not self.closing:
            async with self.turn:
                if self.replaying and not self.closing:
                    await self.continue_replay()

    async def continue_replay(self) -> None:
        """Send stored spans while the client keeps up; at the end, metrics, system samples, log
        tail, status, replay_done."""
        try:
            while batch := await stored_spans(self.run_id, self.sent_seq):
                await self.send_frame(json.dumps(spans_frame(batch)))
                self.sent_seq = batch[-1]["seq"]
                if self.closing:  # the client went away: nothing more to read or send
                    return
                if self.backlog >= self.limit // 2:
                    return  # the client has not caught up: its next ack continues the replay
            metrics, system, status = await current_state(self.run_id)
        except DatabaseError as err:
            await self.refuse_for_now("database", err)
            return
        self.replaying = False
        if metrics:
            await self.send_frame(json.dumps(metrics_frame(metrics)))
        if system:
            await self.send_frame(json.dumps(system_frame(system)))
        first, lines = await sync_to_async(log_tail)(self.run_id)
        if lines:
            await self.send_frame(json.dumps(log_frame(first, lines)))
        await self.send_frame(json.dumps(status))
        await self.send_frame(json.dumps(replay_done_frame(self.sent_seq)))
        if self.live_error is not None:
            await self.refuse_for_now("channel layer", self.live_error)

    async def send_stored_spans(self, through: int) -> None:
        """Every stored span after the last one sent, up to ``through``, in seq order."""
        while batch := await stored_spans(self.run_id, self.sent_seq, through):
            await self.send_frame(json.dumps(spans_frame(batch)))
            self.sent_seq = batch[-1]["seq"]

    async def live(self, message: dict) -> None:
        """One live frame from the run's feed (controller/live/fanout.py), in order."""
        async with self.turn:
            if message["type"] == "run.resync":
                await self.run_resync(message)
            elif message["type"] == "run.frame":
                await self.run_frame(message)

    async def on_overflow(self) -> None:
        """More live frames waited for this socket than it sends on: it is too slow for them."""
        if not self.closing:
            self.closing = True
            await self.close(code=CLOSE_TOO_SLOW)

    async def run_resync(self, event):
        """The publisher dropped frames of this run while the layer was down: resume from the database."""
        if not self.replaying and not self.closing:
            await self.refuse_for_now("channel layer", layer_groups.MembershipLost("live frames were dropped"))

    async def run_frame(self, event):
        if self.replaying or self.closing:  # the replay reads these from the database
            return
        first, last = event.get("first_seq"), event.get("last_seq")
        if first is None:  # metrics, status, log: as published
            await self.send_frame(event["text"])
        elif last <= self.sent_seq:
            return
        elif first == self.sent_seq + 1:
            await self.send_frame(event["text"])
            self.sent_seq = last
        else:  # a frame went missing (or overlaps what was sent): the database has it
            try:
                await self.send_stored_spans(through=last)
            except DatabaseError as err:
                await self.refuse_for_now("database", err)
                return
        if self.backlog > self.limit:
            self.closing = True
            await self.close(code=CLOSE_TOO_SLOW)
