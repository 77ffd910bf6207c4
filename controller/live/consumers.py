"""The live run page's websocket: replay from the database, then live frames.

Protocol (docs/web-contract.md): connect to /ws/runs/<id>/?after=<seq>; the server replays
every stored span with seq > after in batches, all metrics, the status and
``replay_done``, then forwards live frames; the client acknowledges the frames it has
received, which paces the replay and bounds what a slow viewer can leave buffered. Each
span is delivered exactly once: the consumer joins the run's group before it reads the
database, remembers the highest seq it sent, drops live spans at or below it, and reads a
gap (a dropped live frame) back from the database, which the ingestor always writes before
it publishes.
"""

import asyncio
import json
import logging
import weakref
from collections import deque
from urllib.parse import parse_qs

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError

from controller.live import fanout
from controller.live import layer_groups
from controller.models import Run, Span
from controller.limits.outages import OUTAGE_ERRORS
from controller.supervision.runlog import log_tail
from controller.live.frames import log_frame, metrics_frame, replay_done_frame, spans_frame, status_frame, system_frame
from controller.jsonapi.serializers import metrics_json, spans_json, system_json

try:  # daphne's websocket protocol (autobahn) raises this on a send after the client went away
    from autobahn.exception import Disconnected as ClientGone
except ImportError:  # another ASGI server: nothing of this kind to catch
    class ClientGone(Exception):  # type: ignore[no-redef]
        pass

REPLAY_BATCH = 2000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
CLOSE_TOO_SLOW = 4408  # the viewer fell THUNDERSYNC_WS_BACKLOG_BYTES behind: reconnect with ?after
# An infrastructure outage (database, channel layer): "try again later". Not the standard 1013:
# daphne's websocket library sends only 1000 and 3000-4999 (a 1013 reached the client as 1011).
CLOSE_TRY_AGAIN_LATER = 4503
# The user has THUNDERSYNC_WS_PER_USER sockets open in this server process already: final (the page
# does not reconnect; it asks to close other views and reload).
CLOSE_TOO_MANY = 4429
MAX_CLIENT_FRAME_CHARS = 200  # {"type": "ack", "frames": n} is ~40 characters
log = logging.getLogger(__name__)


# Open sockets per user, per event loop (daphne has one per process; each test its own): the
# consumers' ids, a user's entry removed with their last socket.
_open: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, set[int]]]" = weakref.WeakKeyDictionary()


def open_sockets() -> dict[int, set[int]]:
    """This process's open sockets by user id (the cap's count; tests and the load bench read it)."""
    return _open.setdefault(asyncio.get_running_loop(), {})


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


class RunConsumer(AsyncWebsocketConsumer):
    """One viewer of one run. Frames go out as text encoded once by the publisher
    (``live.publish``); every frame sent is counted, and the client acknowledges how many it has
    received (``{"type": "ack", "frames": n}``), so the server knows each socket's backlog:
    the replay is paced by it (it sends while less than half the limit is unacknowledged),
    and a viewer whose live backlog passes ``THUNDERSYNC_WS_BACKLOG_BYTES`` is closed with
    ``CLOSE_TOO_SLOW``; the page then reconnects with ``?after`` and reads the rest from the
    database (docs/controller-api.md, "Websocket")."""

    accepted = False
    replaying = closing = False
    live_error: Exception | None = None
    feed: "fanout.RunFeed | None" = None

    async def refuse(self, code: int) -> None:
        """Accept, then close with ``code``: a close before accept would reach the browser as
        a bare HTTP 403, and the page could not tell an expired session from a network drop."""
        await self.accept()
        await self.close(code=code)

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        mine = open_sockets().setdefault(user.pk, set())
        if len(mine) >= settings.THUNDERSYNC_WS_PER_USER:
            if not mine:
                del open_sockets()[user.pk]
            await self.accept()
            await self.close(code=CLOSE_TOO_MANY, reason=(
                f"{len(mine)} live views open, the limit is {settings.THUNDERSYNC_WS_PER_USER} per user"))
            return
        mine.add(id(self))
        self.user_id = user.pk
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

    async def refuse_for_now(self, what: str, err: Exception) -> None:
        """Close with CLOSE_TRY_AGAIN_LATER: the page reconnects from its last seq."""
        log.warning("websocket: the %s is unreachable (%s); asking the client to reconnect", what, err)
        self.closing = True
        if self.accepted:
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
        else:
            await self.refuse(CLOSE_TRY_AGAIN_LATER)

    async def accept(self, subprotocol=None, headers=None):
        self.accepted = True
        await super().accept(subprotocol, headers)

    async def __call__(self, scope, receive, send):
        """The channel layer failing inside the dispatch loop (its receive is part of the loop)
        closes the socket with CLOSE_TRY_AGAIN_LATER, not 1011 with a traceback."""
        try:
            await super().__call__(scope, receive, send)
        except (*OUTAGE_ERRORS, OSError) as err:
            log.warning("websocket: the channel layer is unreachable (%s); closing with %s", err, CLOSE_TRY_AGAIN_LATER)
            if not self.closing:
                self.closing = True
                try:
                    await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER})
                except Exception:  # noqa: BLE001 (the connection went with it: nothing left to tell)
                    pass

    async def disconnect(self, code):
        self.closing = True
        user_id = getattr(self, "user_id", None)
        if user_id is not None:  # counted against the user's cap until now
            mine = open_sockets().get(user_id, set())
            mine.discard(id(self))
            if not mine:
                open_sockets().pop(user_id, None)
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
