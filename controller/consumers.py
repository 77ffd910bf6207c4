"""The live run page's websocket: replay from the database, then live frames.

Protocol (docs/web-contract.md): connect to /ws/runs/<id>/?after=<seq>; the server replays
every stored span with seq > after in batches, all metrics, the status and
``replay_done``, then forwards live frames. Each span is delivered exactly once: the
consumer joins the run's group before it reads the database, remembers the highest seq
it sent, drops live spans at or below it, and reads a gap (a dropped live frame) back
from the database, which the ingestor always writes before it publishes.
"""

import logging
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import DatabaseError

from .live import group_name
from .models import Run, Span
from .frames import metrics_frame, replay_done_frame, spans_frame, status_frame
from .serializers import metrics_json, spans_json

REPLAY_BATCH = 2000
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
CLOSE_TRY_AGAIN_LATER = 1013  # an infrastructure outage (database, channel layer)
log = logging.getLogger(__name__)


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
def current_state(run_id: int) -> tuple[list[dict], dict]:
    return metrics_json(run_id), status_frame(Run.objects.get(pk=run_id))


def after_param(query_string: bytes) -> int | None:
    values = parse_qs(query_string.decode("latin-1")).get("after", ["-1"])
    try:
        after = int(values[-1])
    except ValueError:
        return None
    return after if -1 <= after < 2**31 else None


class RunConsumer(AsyncJsonWebsocketConsumer):
    accepted = False
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
        try:
            await self.channel_layer.group_add(group_name(run.pk), self.channel_name)
        except Exception as err:  # the channel layer is down: replay what is stored, then retry later
            live_error = err
        else:
            self.group, live_error = group_name(run.pk), None
        try:
            await self.accept()
            await self.send_stored_spans()
            metrics, status = await current_state(run.pk)
        except DatabaseError as err:
            await self.refuse_for_now("database", err)
            return
        if metrics:
            await self.send_json(metrics_frame(metrics))
        await self.send_json(status)
        await self.send_json(replay_done_frame(self.sent_seq))
        if live_error is not None:
            await self.refuse_for_now("channel layer", live_error)

    async def refuse_for_now(self, what: str, err: Exception) -> None:
        """Close with 1013 (try again later): the page reconnects from its last seq."""
        log.warning("websocket: the %s is unreachable (%s); asking the client to reconnect", what, err)
        if self.accepted:
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
        else:
            await self.refuse(CLOSE_TRY_AGAIN_LATER)

    async def accept(self, subprotocol=None, headers=None):
        self.accepted = True
        await super().accept(subprotocol, headers)

    async def disconnect(self, code):
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def send_stored_spans(self, through: int | None = None) -> None:
        """Every stored span after the last one sent (up to ``through``), in seq order."""
        while batch := await stored_spans(self.run_id, self.sent_seq, through):
            await self.send_json(spans_frame(batch))
            self.sent_seq = batch[-1]["seq"]

    async def run_frame(self, event):
        frame = event["frame"]
        if frame["type"] != "spans":
            await self.send_json(frame)
            return
        fresh = [s for s in frame["spans"] if s["seq"] > self.sent_seq]
        if not fresh:
            return
        if fresh[0]["seq"] != self.sent_seq + 1:  # a frame went missing: the database has it
            try:
                await self.send_stored_spans(through=fresh[-1]["seq"])
            except DatabaseError as err:
                await self.refuse_for_now("database", err)
            return
        await self.send_json(spans_frame(fresh))
        self.sent_seq = fresh[-1]["seq"]
