"""The run websocket's flow control: acks pace the replay, a stalled viewer is closed with 4408
within a bounded backlog and recovers every span with ?after; frames are encoded once."""

import json

import pytest
from channels.db import database_sync_to_async

from controller.live import consumers
from controller.live.consumers import CLOSE_TOO_SLOW
from controller.live.broadcast import publish

from .test_consumers import connect, receive_until_replay_done, span_dicts, span_seqs, store_spans_range

pytestmark = pytest.mark.django_db(transaction=True)


async def ack(communicator, frames: int) -> None:
    await communicator.send_to(text_data=json.dumps({"type": "ack", "frames": frames}))


async def receive_acking(communicator, frames: int, until: str | None = None) -> tuple[list[int], int]:
    """Read frames, acknowledging each as the page does, until one of type ``until`` (or just one);
    returns the span seqs read and the number of frames received so far on this socket."""
    seqs = []
    while True:
        frame = json.loads((await communicator.receive_output(timeout=5))["text"])
        frames += 1
        await ack(communicator, frames)
        seqs += span_seqs([frame])
        if until is None or frame["type"] == until:
            return seqs, frames


async def publish_stored(run, start: int, stop: int) -> None:
    """What the ingestor does: store the spans, then publish them as one frame."""
    await database_sync_to_async(store_spans_range)(run, start, stop)
    await database_sync_to_async(publish)(run.pk, {"type": "spans", "spans": await span_dicts(run, start, stop)})


async def test_a_stalled_viewer_is_closed_within_the_backlog_and_recovers_every_span(alice_run, alice, settings):
    settings.THUNDERSYNC_WS_BACKLOG_BYTES = limit = 20_000
    stalled, connected, _ = await connect(alice_run, user=alice)
    assert connected
    replay = await receive_until_replay_done(stalled)  # read, but never acknowledged
    for start in range(0, 2000, 50):  # the run goes on; this viewer reads nothing
        await publish_stored(alice_run, start, start + 50)
    sent, frame_sizes, close_code = [], [], None
    while close_code is None:
        out = await stalled.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            close_code = out.get("code")
        else:
            frame_sizes.append(len(out["text"]))
            sent += span_seqs([json.loads(out["text"])])
    assert close_code == CLOSE_TOO_SLOW
    # closed at the first frame past the limit: the unacknowledged bytes stayed bounded
    unacked = sum(len(json.dumps(f)) for f in replay) + sum(frame_sizes)
    assert limit < unacked <= limit + max(frame_sizes)
    assert sent == list(range(len(sent))) and len(sent) < 2000
    await stalled.disconnect()

    # the page reconnects after the highest seq it holds and gets the rest from the database
    resumed, connected, _ = await connect(alice_run, user=alice, after=sent[-1])
    assert connected
    received, _ = await receive_acking(resumed, 0, until="replay_done")
    assert sent + received == list(range(2000))
    await resumed.disconnect()


async def test_the_replay_waits_for_acks_and_a_viewer_that_acks_is_never_closed(alice_run, alice, settings):
    settings.THUNDERSYNC_WS_BACKLOG_BYTES = 200_000
    await database_sync_to_async(store_spans_range)(alice_run, 0, 6000)  # ~3 replay frames of 2000
    viewer, connected, _ = await connect(alice_run, user=alice)
    assert connected
    first = json.loads((await viewer.receive_output(timeout=5))["text"])
    assert len(first["spans"]) == consumers.REPLAY_BATCH
    assert await viewer.receive_nothing(timeout=0.5)  # half the limit is in flight: it waits
    await ack(viewer, 1)
    rest, frames = await receive_acking(viewer, 1, until="replay_done")
    seqs = span_seqs([first]) + rest
    for start in range(6000, 9000, 100):  # live frames, acknowledged as they come
        await publish_stored(alice_run, start, start + 100)
        live, frames = await receive_acking(viewer, frames)
        seqs += live
    assert seqs == list(range(9000))
    await viewer.disconnect()


async def test_a_live_frame_is_encoded_once_for_all_viewers(alice_run, alice, monkeypatch):
    viewers = []
    for _ in range(3):
        viewer, connected, _ = await connect(alice_run, user=alice)
        assert connected
        await receive_until_replay_done(viewer)
        viewers.append(viewer)
    encoded = []
    real_dumps = json.dumps
    monkeypatch.setattr(consumers.json, "dumps", lambda *a, **k: encoded.append(a) or real_dumps(*a, **k))
    await publish_stored(alice_run, 0, 10)
    texts = [(await v.receive_output(timeout=5))["text"] for v in viewers]
    # one encoding (the publisher's) for the three viewers; each got the same text
    assert len(encoded) == 1 and len(set(texts)) == 1
    assert span_seqs([json.loads(texts[0])]) == list(range(10))
    for v in viewers:
        await v.disconnect()


@pytest.mark.parametrize("text", ['{"type": "ack", "frames": 1e20}', '{"type": "ack", "frames": true}',
                                  '{"type": "ack", "frames": "99"}', '{"type": "ack", "frames": -1}',
                                  "[" * 100_000 + "]" * 100_000])
def test_a_fake_or_hostile_ack_is_ignored(text):
    assert consumers.parse_ack(text) is None
    assert consumers.parse_ack('{"type": "ack", "frames": 12}') == 12


async def test_fake_acks_do_not_switch_off_the_backpressure(alice_run, alice, settings):
    """A viewer that acknowledges more than it was sent (or sends a 100k-deep frame) is still
    closed at the backlog limit: its acks count at most the frames sent so far."""
    settings.THUNDERSYNC_WS_BACKLOG_BYTES = 20_000
    viewer, connected, _ = await connect(alice_run, user=alice)
    assert connected
    await receive_until_replay_done(viewer)
    await viewer.send_to(text_data="[" * 100_000 + "]" * 100_000)
    await ack(viewer, 10**30)  # "everything, forever": capped at the frames sent until now
    close_code = None
    for start in range(0, 2000, 50):
        await publish_stored(alice_run, start, start + 50)
    while close_code is None:
        out = await viewer.receive_output(timeout=5)
        close_code = out.get("code") if out["type"] == "websocket.close" else None
    assert close_code == CLOSE_TOO_SLOW
    await viewer.disconnect()
