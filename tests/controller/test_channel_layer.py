"""The channel layer's backup-queue cleanup, started after each delivered message and never
awaited, says a Redis outage in one warning line instead of an unretrieved task's traceback
(controller/live/channel_layer.py)."""

import logging
import socket

from controller.live.channel_layer import QuietCleanupRedisChannelLayer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once it is closed


async def test_a_cleanup_that_meets_an_outage_is_one_warning(caplog):
    layer = QuietCleanupRedisChannelLayer(hosts=[{"address": f"redis://127.0.0.1:{closed_port()}",
                                                  "socket_connect_timeout": 1}])
    with caplog.at_level(logging.WARNING, logger="controller.live.channel_layer"):
        assert await layer._clean_receive_backup(0, "asgi.specific.x!") is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("channel layer: a delivered message's backup copy was not removed")
