"""A websocket outlives a Redis that forgot its group (its process's membership, controller/live/fanout.py),
and a publisher that dropped frames: the page is asked to reconnect (4503) and replays what it missed from the database
(docs/controller-faults.md, "Connections"). The group is forgotten by deleting its key, as a restart
without persistence does, while every connection stays open, so the consumer's receive loop
sees no error: the case only the periodic rejoin catches; a receive path that delivers
nothing more is caught by its probes. The restart itself is in
test_connections_load.py."""

import time

import pytest
from channels.layers import get_channel_layer

from controller.live import broadcast as live
from controller.live.socket_admission import CLOSE_TRY_AGAIN_LATER
from controller.live.broadcast import group_name, publish

from .test_consumers import close_code, connect, receive_until_replay_done

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quick_checks(settings):
    settings.THUNDERSYNC_WS_GROUP_CHECK_S = 0.2


async def test_a_socket_whose_group_redis_forgot_is_asked_to_resume(alice_run, alice, quick_checks):
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    await receive_until_replay_done(communicator)
    layer = get_channel_layer()
    key = layer._group_key(group_name(alice_run.pk))
    connection = layer.connection(layer.consistent_hash(group_name(alice_run.pk)))
    assert await connection.zcard(key) == 1
    started = time.monotonic()
    await connection.delete(key)  # what a Redis restart does to every group
    assert await close_code(communicator) == CLOSE_TRY_AGAIN_LATER
    assert time.monotonic() - started < 3.0


async def test_a_socket_still_in_its_group_stays_and_gets_live_frames(alice_run, alice, quick_checks):
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    await receive_until_replay_done(communicator)
    assert await communicator.receive_nothing(timeout=1.0)  # five checks: each finds it in its group
    live_frame = {"type": "log", "first": 0, "lines": ["still here"]}
    await live.asyncio.to_thread(publish, alice_run.pk, live_frame)
    assert await communicator.receive_json_from(timeout=5) == live_frame
    await communicator.disconnect()


async def test_pages_of_a_run_whose_frames_were_dropped_resume_once_the_layer_is_back(alice_run, alice, monkeypatch):
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    await receive_until_replay_done(communicator)
    send = live._group_send

    def down(*args):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(live, "_group_send", down)
    await live.asyncio.to_thread(publish, alice_run.pk, {"type": "status", "status": "succeeded"})
    assert alice_run.pk in live._dropped
    monkeypatch.setattr(live, "_group_send", send)
    other = {"type": "log", "first": 0, "lines": ["back"]}
    await live.asyncio.to_thread(publish, alice_run.pk, other)  # the first frame after the outage
    assert await communicator.receive_json_from(timeout=5) == other
    assert await close_code(communicator) == CLOSE_TRY_AGAIN_LATER  # then: replay from the database
    assert not live._dropped


async def test_a_socket_whose_probes_never_come_back_is_asked_to_resume(alice_run, alice, quick_checks, monkeypatch):
    from controller.live.fanout import RunFeed

    def lost(self, message):  # the layer's receive path delivers nothing more to this process
        return None

    monkeypatch.setattr(RunFeed, "on_probe", lost)
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    await receive_until_replay_done(communicator)
    started = time.monotonic()
    assert await close_code(communicator) == CLOSE_TRY_AGAIN_LATER
    assert 0.3 < time.monotonic() - started < 3.0  # not at the first check: a probe may be one check late
