"""A server process joins a run's channel-layer group once, whatever the number of its viewers of
that run, and hands each frame to each of them in-process (controller/live/fanout.py); a viewer too
slow for the frames is closed 4408 without holding up the others (docs/controller-faults.md,
"Connections")."""

import asyncio
import sys
import time

import pytest
from channels.layers import get_channel_layer

from controller.live import fanout
from controller.live import broadcast as live
from controller.live.consumers import CLOSE_TOO_SLOW, RunConsumer
from controller.live.broadcast import group_name, publish

from .test_consumers import connect, receive_until_replay_done

pytestmark = pytest.mark.django_db(transaction=True)


async def members(run) -> int:
    layer = get_channel_layer()
    key = layer._group_key(group_name(run.pk))
    return await layer.connection(layer.consistent_hash(group_name(run.pk))).zcard(key)


async def test_viewers_of_one_run_share_one_membership_and_each_gets_every_frame(alice_run, alice):
    viewers = []
    for _ in range(3):
        communicator, connected, _ = await connect(alice_run, user=alice)
        assert connected
        await receive_until_replay_done(communicator)
        viewers.append(communicator)
    assert await members(alice_run) == 1 and fanout.feed_count() == 1
    frames = [{"type": "log", "first": i, "lines": [f"line {i}"]} for i in range(5)]
    for frame in frames:
        await live.asyncio.to_thread(publish, alice_run.pk, frame)
    for communicator in viewers:
        assert [await communicator.receive_json_from(timeout=5) for _ in frames] == frames
    for communicator in viewers[:2]:
        await communicator.disconnect()
    assert await members(alice_run) == 1  # the last viewer still holds the process's membership
    await live.asyncio.to_thread(publish, alice_run.pk, frames[0])
    assert await viewers[2].receive_json_from(timeout=5) == frames[0]
    await viewers[2].disconnect()
    assert await members(alice_run) == 0 and fanout.feed_count() == 0


async def test_a_viewer_too_slow_for_the_frames_is_closed_and_the_others_get_them_all(alice_run, alice, settings,
                                                                                       monkeypatch):
    settings.THUNDERSYNC_WS_INBOX_FRAMES = 5
    stuck = asyncio.Event()
    real_live = RunConsumer.live

    async def slow_for_the_first(self, message):  # the first socket stops sending (a stalled client)
        if self.scope.get("query_string") == b"after=-1":
            await stuck.wait()
        await real_live(self, message)

    monkeypatch.setattr(RunConsumer, "live", slow_for_the_first)
    slow, connected, _ = await connect(alice_run, user=alice, after=-1)
    assert connected
    await receive_until_replay_done(slow)
    fast, connected, _ = await connect(alice_run, user=alice, after=0)
    assert connected
    await receive_until_replay_done(fast)
    frames = [{"type": "log", "first": i, "lines": [f"line {i}"]} for i in range(12)]
    for frame in frames:
        await live.asyncio.to_thread(publish, alice_run.pk, frame)
    assert [await fast.receive_json_from(timeout=5) for _ in frames] == frames
    stuck.set()
    outputs = []
    while not outputs or outputs[-1]["type"] != "websocket.close":
        outputs.append(await slow.receive_output(timeout=5))
    await slow.disconnect()
    assert outputs[-1]["code"] == CLOSE_TOO_SLOW  # its page resumes from the database
    assert len(outputs) <= 2  # at most the frame it was sending when its inbox filled up
    await fast.disconnect()


async def test_a_task_whose_cancellation_was_lost_is_cancelled_again_until_it_ends():
    """What a feed's stop does with its receive (fanout.end_tasks): on Python 3.11,
    ``asyncio.wait_for`` (redis-py's send of each command) drops a cancellation that arrives after
    the send is done and before the task resumes, and channels-redis's receive loop pops on."""
    async def send():
        return None

    async def receive():  # channels-redis: pop until a message comes, each command sent through wait_for
        while True:
            await asyncio.wait_for(send(), timeout=30)
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(receive())
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # its send is done; the task has not resumed yet
    task.cancel()
    await asyncio.sleep(0.2)
    assert task.done() == (sys.version_info >= (3, 12))  # 3.11 lost that cancellation
    started = time.monotonic()
    assert await fanout.end_tasks([task], timeout_s=5.0) == [] and task.cancelled()
    assert time.monotonic() - started < 1.0


async def test_waiting_for_a_task_that_will_not_end_is_bounded():
    stop = asyncio.Event()

    async def stubborn():
        while not stop.is_set():
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                pass

    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    started = time.monotonic()
    assert await fanout.end_tasks([task], timeout_s=0.3) == [task]
    assert 0.3 <= time.monotonic() - started < 2.0
    stop.set()
    assert await fanout.end_tasks([task]) == [] and task.done()
