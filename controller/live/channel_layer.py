"""channels-redis's layer, with its fire-and-forget cleanup quiet about an outage.

After each message it pops, channels-redis starts a task that removes the message's copy from the
channel's backup queue (``_clean_receive_backup``) and never awaits it. When Redis goes away
between the pop and that task (a restart, docs/controller-faults.md "Connections"), the task fails and
asyncio logs "Task exception was never retrieved" with a traceback, though nothing is lost: the
message was delivered, and a Redis that restarts without persistence has no backup queue left to
clean. Here that failure is one warning line; the next receive meets the outage itself and the
websockets close 4503 as for any other.
"""

from __future__ import annotations

import logging

import redis.exceptions
from channels_redis.core import RedisChannelLayer

log = logging.getLogger(__name__)


class QuietCleanupRedisChannelLayer(RedisChannelLayer):
    async def _clean_receive_backup(self, index, channel):
        try:
            await super()._clean_receive_backup(index, channel)
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as err:
            log.warning("channel layer: a delivered message's backup copy was not removed (%s)", err)
