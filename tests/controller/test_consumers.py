"""The run websocket through the real ASGI stack: session auth, origin check, replay + live."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from controller.asgi import application
from controller.live.broadcast import publish
from controller.models import Span, SystemSample
from controller.jsonapi.serializers import spans_json

from .conftest import store_metrics, store_spans

pytestmark = pytest.mark.django_db(transaction=True)


def session_headers(user, origin=b"http://testserver"):
    """A page at ``origin`` opening a socket on http://testserver (its Host) as ``user``."""
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode()), (b"host", b"testserver"),
            (b"origin", origin)]


async def connect(run, user=None, after=None, origin=b"http://testserver", scheme="ws", extra_headers=()):
    if user:
        headers = await database_sync_to_async(session_headers)(user, origin)
    else:
        headers = [(b"host", b"testserver"), (b"origin", origin)]
    headers += list(extra_headers)
    path = f"/ws/runs/{run.pk}/" + (f"?after={after}" if after is not None else "")
    communicator = WebsocketCommunicator(application, path, headers=headers)
    communicator.scope["scheme"] = scheme
    connected, code = await communicator.connect(timeout=5)
    if not connected:
        # a refused consumer still waits on its channel layer: end it here, not in the event
        # loop's teardown (a cancelled channels-redis receive can lose its cancellation and pop
        # on: see conftest.bounded_loop_teardown)
        await communicator.disconnect()
    return communicator, connected, code


async def receive_until_replay_done(communicator) -> list[dict]:
    frames = []
    while not frames or frames[-1]["type"] != "replay_done":
        frames.append(await communicator.receive_json_from(timeout=5))
    return frames


def span_seqs(frames) -> list[int]:
    return [s["seq"] for f in frames if f["type"] == "spans" for s in f["spans"]]


def store_spans_range(run, start: int, stop: int) -> None:
    Span.objects.bulk_create([
        Span(run=run, seq=i, step=0, kind="learner.backward", t0=float(i), t1=i + 0.5, lane="learner/0")
        for i in range(start, stop)
    ])


@database_sync_to_async
def span_dicts(run, start: int, stop: int) -> list[dict]:
    return spans_json(Span.objects.filter(run=run, seq__gte=start, seq__lt=stop))


async def close_code(communicator) -> int:
    """Refusals are accepted, then closed with the documented code (docs/web-contract.md)."""
    message = await communicator.receive_output(timeout=5)
    await communicator.disconnect()
    assert message["type"] == "websocket.close", message
    return message["code"]


async def test_it_refuses_anonymous_users(alice_run):
    communicator, connected, _ = await connect(alice_run)
    assert connected and await close_code(communicator) == 4401


async def test_it_rejects_other_users_run(alice_run, bob):
    communicator, connected, _ = await connect(alice_run, user=bob)
    assert connected and await close_code(communicator) == 4404


@pytest.mark.parametrize("origin", [
    b"http://evil.example",
    b"http://testserver:8001",  # another port of the allowed host
    b"https://testserver",  # another scheme of the allowed host
    b"null",
    b"",
])
async def test_it_refuses_foreign_origins(alice_run, alice, origin):
    communicator, connected, _ = await connect(alice_run, user=alice, origin=origin)
    assert not connected


async def test_it_accepts_the_socket_origin_and_trusted_origins(alice_run, alice, settings):
    secure, _, _ = await connect(alice_run, user=alice, origin=b"https://testserver", scheme="wss")
    settings.CSRF_TRUSTED_ORIGINS = ["https://lab.example.com:8443"]
    trusted, _, _ = await connect(alice_run, user=alice, origin=b"https://lab.example.com:8443")
    _, wrong_port, _ = await connect(alice_run, user=alice, origin=b"https://lab.example.com")
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied, _, _ = await connect(alice_run, user=alice, origin=b"https://testserver",
                                  extra_headers=[(b"x-forwarded-proto", b"https")])
    for communicator in (secure, trusted, proxied):
        assert (await receive_until_replay_done(communicator))[-1]["type"] == "replay_done"
        await communicator.disconnect()
    assert not wrong_port


async def test_it_refuses_a_malformed_cursor(alice_run, alice):
    communicator, connected, _ = await connect(alice_run, user=alice, after="x")
    assert connected and await close_code(communicator) == 4400


async def test_it_replays_everything_then_status(alice_run, alice):
    await database_sync_to_async(store_spans)(alice_run, 2500)
    await database_sync_to_async(store_metrics)(alice_run, 2)
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    frames = await receive_until_replay_done(communicator)
    assert span_seqs(frames) == list(range(2500))
    assert max(len(f["spans"]) for f in frames if f["type"] == "spans") <= 2000
    kinds = [f["type"] for f in frames]
    assert kinds[-3:] == ["metrics", "status", "replay_done"]
    assert frames[-2]["status"] == "succeeded" and frames[-1]["last_seq"] == 2499
    await communicator.disconnect()


async def test_the_replay_sends_the_system_samples_in_time_order_after_the_metrics(alice_run, alice):
    await database_sync_to_async(store_metrics)(alice_run, 1)
    for t in (4.0, 2.0):
        await database_sync_to_async(SystemSample.objects.create)(
            run=alice_run, t=t, node="n1", values={"system/driver/rss_mb": 10 * t})
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    frames = await receive_until_replay_done(communicator)
    assert [f["type"] for f in frames][-4:] == ["metrics", "system", "status", "replay_done"]
    assert frames[-3]["samples"] == [{"t": 2.0, "node": "n1", "values": {"system/driver/rss_mb": 20.0}},
                                     {"t": 4.0, "node": "n1", "values": {"system/driver/rss_mb": 40.0}}]
    await communicator.disconnect()


async def test_a_client_gone_mid_replay_ends_the_replay_without_a_traceback(alice_run, alice, monkeypatch):
    """daphne raises autobahn's Disconnected on a send after the client left (a viewer closing
    its tab while thousands of spans replay): the consumer stops sending and reading, quietly."""
    from channels.generic.websocket import AsyncWebsocketConsumer

    from controller.live import consumers

    await database_sync_to_async(store_spans)(alice_run, 2500)  # two replay batches
    real_send, sent = AsyncWebsocketConsumer.send, []

    async def send_then_gone(self, text_data=None, bytes_data=None, close=False):
        if text_data and '"spans"' in text_data[:20]:
            sent.append(text_data)
            raise consumers.ClientGone("Attempt to send on a closed protocol")
        await real_send(self, text_data, bytes_data, close)

    monkeypatch.setattr(AsyncWebsocketConsumer, "send", send_then_gone)
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    assert await communicator.receive_nothing(timeout=0.5)  # nothing after the failed send, no crash
    assert len(sent) == 1  # the second batch was neither read nor sent
    await communicator.disconnect()


async def test_reconnecting_delivers_every_span_exactly_once(alice_run, alice):
    await database_sync_to_async(store_spans)(alice_run, 10)
    seen = []

    first, _, _ = await connect(alice_run, user=alice, after=4)
    seen += span_seqs(await receive_until_replay_done(first))
    # Live frames may overlap what the replay already sent: the overlap is dropped.
    await database_sync_to_async(store_spans_range)(alice_run, 10, 13)
    await database_sync_to_async(publish)(alice_run.pk, {"type": "spans", "spans": await span_dicts(alice_run, 8, 13)})
    seen += span_seqs([await first.receive_json_from(timeout=5)])
    # A frame that never arrived (spans 13-14 stored, not published) is read back from the database.
    await database_sync_to_async(store_spans_range)(alice_run, 13, 17)
    await database_sync_to_async(publish)(alice_run.pk, {"type": "spans", "spans": await span_dicts(alice_run, 15, 17)})
    seen += span_seqs([await first.receive_json_from(timeout=5)])
    await first.disconnect()

    # The client reconnects after the highest seq it drew; more spans were stored meanwhile.
    await database_sync_to_async(store_spans_range)(alice_run, 17, 20)
    second, _, _ = await connect(alice_run, user=alice, after=max(seen))
    seen += span_seqs(await receive_until_replay_done(second))
    await second.disconnect()

    assert sorted(seen) == list(range(5, 20))
    assert len(seen) == len(set(seen))


async def test_it_forwards_live_metrics_and_status(alice_run, alice):
    communicator, _, _ = await connect(alice_run, user=alice)
    await receive_until_replay_done(communicator)
    await database_sync_to_async(publish)(alice_run.pk, {"type": "metrics", "metrics": [{"step": 0, "values": {"a": 1}}]})
    assert await communicator.receive_json_from(timeout=5) == {"type": "metrics",
                                                               "metrics": [{"step": 0, "values": {"a": 1}}]}
    await communicator.disconnect()
