"""Websockets per user: a cap per server process (THUNDERSYNC_WS_PER_USER), the extra socket
closed 4429, and every per-socket structure freed when sockets close."""

import gc
import weakref

import pytest

from controller.live import consumers
from controller.live import fanout
from controller.live import socket_admission

from .test_consumers import close_code, connect, receive_until_replay_done

pytestmark = pytest.mark.django_db(transaction=True)


async def open_live(run, user) -> object:
    communicator, connected, _ = await connect(run, user=user)
    assert connected
    assert (await receive_until_replay_done(communicator))[-1]["type"] == "replay_done"
    return communicator


async def test_a_socket_past_the_per_user_cap_is_closed_4429(alice_run, alice, bob, settings):
    settings.THUNDERSYNC_WS_PER_USER = 3
    mine = [await open_live(alice_run, alice) for _ in range(3)]
    assert len(socket_admission.open_sockets()[alice.pk]) == 3
    extra, connected, _ = await connect(alice_run, user=alice)
    assert connected
    message = await extra.receive_output(timeout=5)
    await extra.disconnect()
    assert message == {"type": "websocket.close", "code": socket_admission.CLOSE_TOO_MANY,
                       "reason": "3 live views open, the limit is 3 per user"}
    # another user's sockets are theirs (bob's socket is refused 4404 as not his run, not 4429)
    bobs, connected, _ = await connect(alice_run, user=bob)
    assert connected and await close_code(bobs) == socket_admission.CLOSE_NOT_FOUND
    # closing one makes room for one
    await mine.pop().disconnect()
    mine.append(await open_live(alice_run, alice))
    for communicator in mine:
        await communicator.disconnect()
    assert socket_admission.open_sockets() == {}


async def test_every_per_socket_structure_is_freed_when_sockets_close(alice_run, alice, settings, monkeypatch):
    """A burst of sockets opened and closed leaves nothing behind: no consumer (with its backlog
    deque and inbox), no feed, no count."""
    settings.THUNDERSYNC_WS_PER_USER = 64
    made = []
    original = consumers.RunConsumer.connect

    async def recorded(self):
        made.append(weakref.ref(self))
        await original(self)

    monkeypatch.setattr(consumers.RunConsumer, "connect", recorded)
    sockets = [await open_live(alice_run, alice) for _ in range(20)]
    assert len(socket_admission.open_sockets()[alice.pk]) == 20 and fanout.feed_count() == 1
    for communicator in sockets:
        await communicator.disconnect()
    del sockets, communicator
    gc.collect()
    assert len(made) == 20 and [ref for ref in made if ref() is not None] == []
    assert socket_admission.open_sockets() == {} and fanout.feed_count() == 0
