"""One channel-layer membership per run and server process; its live frames fanned out in-process.

A run's frames go to the channel-layer group ``run_<id>``. Were every viewer a member, each
frame would cross Redis once per viewer, and channels-redis hands a process its messages one
at a time: 4 runs at 60 span frames/s with 25 viewers each are 6,000 messages a second into one
daphne, more than it pops on a shared core (docs/controller-faults.md, "Connections"). So each process
joins a run's group once, with a channel of its own (a ``RunFeed``), and passes each frame to the
run's sockets in that process. Each socket keeps its own inbox, handled in order by a task of
its own, so a socket waiting on the database (a gap to fill) or on a slow client holds up no
other; an inbox past ``THUNDERSYNC_WS_INBOX_FRAMES`` frames is a viewer too slow to keep up
(``on_overflow``: the consumer closes it 4408, the page replays from the database).

The feed keeps its membership as a socket used to (``layer_groups.watch``: rejoin and probe every
``THUNDERSYNC_WS_GROUP_CHECK_S``), once per run and process instead of once per viewer; a lost
membership, a probe that does not come back or an unreachable layer closes every socket of the
feed with 4503, and the pages resume from their last seq.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Protocol

from django.conf import settings

from controller.live import layer_groups
from controller.live.broadcast import group_name
from controller.limits.outages import OUTAGE_ERRORS

log = logging.getLogger(__name__)
END_TASKS_S = 10.0  # how long a feed that stops waits for its tasks to end (end_tasks)
RECANCEL_S = 0.1


class Viewer(Protocol):
    """What a feed needs of a socket (``consumers.RunConsumer``)."""

    async def live(self, message: dict) -> None: ...  # one frame, in order, after the previous one's

    async def refuse_for_now(self, what: str, err: Exception) -> None: ...  # close 4503

    async def on_overflow(self) -> None: ...  # its inbox is full: close it as too slow


class _Inbox:
    """One socket's frames, handled in arrival order by a task of its own."""

    def __init__(self, viewer: Viewer):
        self.viewer, self.queue, self.overflowed = viewer, asyncio.Queue(), False
        self.task = asyncio.ensure_future(self._drain())

    def put(self, message: dict) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= settings.THUNDERSYNC_WS_INBOX_FRAMES:
            self.overflowed = True
            while not self.queue.empty():  # what it held the page reads back from the database
                self.queue.get_nowait()
            self.queue.put_nowait({"type": "overflow"})
            return
        self.queue.put_nowait(message)

    async def _drain(self) -> None:
        while True:
            message = await self.queue.get()
            try:
                if message["type"] == "overflow":
                    await self.viewer.on_overflow()
                    return
                await self.viewer.live(message)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (one socket's fault must not silence the others)
                log.exception("websocket: a live frame could not be handled; the socket goes on")


class RunFeed:
    """This process's membership of one run's group and the sockets it feeds. It has the attributes
    ``layer_groups.watch`` reads of what it watches (``closing``, ``probes_back``, ``channel_layer``,
    ``group``, ``channel_name``, ``refuse_for_now``)."""

    def __init__(self, layer, run_id: int):
        self.channel_layer, self.run_id, self.group = layer, run_id, group_name(run_id)
        self.inboxes: dict[int, _Inbox] = {}
        self.channel_name = ""
        self.closing = False
        self.probes_back = 0
        self.tasks: list[asyncio.Future] = []
        self.started = asyncio.ensure_future(self._start())

    async def _start(self) -> None:
        self.channel_name = await self.channel_layer.new_channel()
        await self.channel_layer.group_add(self.group, self.channel_name)
        self.tasks = [asyncio.ensure_future(self._pump()), asyncio.ensure_future(layer_groups.watch(self))]

    async def _pump(self) -> None:
        try:
            while not self.closing:
                message = await self.channel_layer.receive(self.channel_name)
                if message.get("type") == "run.probe":
                    self.on_probe(message)
                    continue
                for inbox in list(self.inboxes.values()):
                    inbox.put(message)
        except asyncio.CancelledError:
            raise
        except (*OUTAGE_ERRORS, OSError) as err:
            await self.refuse_for_now("channel layer", err)

    def on_probe(self, message: dict) -> None:
        self.probes_back = message["n"]  # the layer still delivers to this process (layer_groups.watch)

    async def refuse_for_now(self, what: str, err: Exception) -> None:
        """The feed is lost (``layer_groups.watch`` or the receive said so): every socket of it is
        asked to reconnect, and the next one to connect starts a new feed."""
        if self.closing:
            return
        self.closing = True
        _forget(self)
        viewers = [inbox.viewer for inbox in self.inboxes.values()]
        for inbox in self.inboxes.values():
            inbox.task.cancel()
        self.inboxes.clear()
        for viewer in viewers:
            await viewer.refuse_for_now(what, err)
        await self._stop()

    async def _stop(self) -> None:
        current = asyncio.current_task()
        await end_tasks([task for task in self.tasks if task is not current])
        if self.channel_name:
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except (*OUTAGE_ERRORS, OSError) as err:  # its membership expires in the layer
                log.warning("websocket: could not leave %s (%s)", self.group, err)


async def end_tasks(tasks, timeout_s: float = END_TASKS_S) -> list[asyncio.Future]:
    """Cancel ``tasks`` and wait until each has ended, cancelling again every ``RECANCEL_S`` while
    one runs on; the ones still running after ``timeout_s`` are logged and returned.

    One cancellation is not always enough: Python 3.11's ``asyncio.wait_for``, which redis-py
    wraps around every command it sends, drops a cancellation that arrives once the send is done
    but before the waiting task resumes (3.12's does not), and channels-redis's ``receive`` then
    pops again and again, 5 s at a time, until a message comes. A feed's receive is cancelled just
    as it takes over the layer's shared receive from a closing socket, often mid-handshake on a new
    connection, and most such cancellations were lost: the receive ran on for as long as its
    process (and an event loop's close, which cancels once more, sometimes waited for it forever)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            log.warning("websocket: %d task(s) still running after %.0f s of cancelling: %s", len(pending),
                        timeout_s, ", ".join(repr(task) for task in pending))
            break
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_S, left))
    return list(pending)


# Feeds per event loop (daphne has one; each test has its own), per (layer, run).
_feeds: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[int, int], RunFeed]]" = \
    weakref.WeakKeyDictionary()


def _registry() -> dict[tuple[int, int], RunFeed]:
    return _feeds.setdefault(asyncio.get_running_loop(), {})


def _forget(feed: RunFeed) -> None:
    feeds = _registry()
    key = (id(feed.channel_layer), feed.run_id)
    if feeds.get(key) is feed:
        del feeds[key]


async def subscribe(viewer: Viewer, layer, run_id: int) -> RunFeed:
    """Feed ``viewer`` the run's live frames through this process's feed (started on first use).
    Raises what joining the group raised (the layer is down): the caller replays and retries."""
    feeds = _registry()
    key = (id(layer), run_id)
    feed = feeds.get(key)
    if feed is None or feed.closing:
        feed = feeds[key] = RunFeed(layer, run_id)
    try:
        await asyncio.shield(feed.started)
    except BaseException:
        _forget(feed)
        raise
    feed.inboxes[id(viewer)] = _Inbox(viewer)
    return feed


async def unsubscribe(viewer: Viewer, feed: RunFeed) -> None:
    """``viewer`` is gone; the last one to go ends the feed's membership."""
    inbox = feed.inboxes.pop(id(viewer), None)
    if inbox is not None:
        inbox.task.cancel()
    if not feed.inboxes and not feed.closing:
        feed.closing = True
        _forget(feed)
        await feed._stop()


def feed_count() -> int:
    """Feeds open in this event loop (tests, the load bench)."""
    return len(_registry())
