"""A websocket's place in its run's channel-layer group, kept across Redis restarts.

A group is a sorted set in Redis (channels-redis): a restart without persistence, or a flush,
forgets it, and a consumer whose receive loop did not notice (its connection was re-established
in between) would stay open without any live frame. So each consumer re-adds itself every
THUNDERSYNC_WS_GROUP_CHECK_S: the ZADD refreshes its membership and tells whether it was
missing, and a consumer that was missing asks its page to reconnect (4503), which replays what
it missed from the database (docs/controller-faults.md, "Connections").
"""

from __future__ import annotations

import asyncio
import logging
import time

from django.conf import settings

from controller.limits.outages import OUTAGE_ERRORS

log = logging.getLogger(__name__)


class MembershipLost(ConnectionError):
    """The channel layer no longer held the socket in its run's group."""


async def rejoin(layer, group: str, channel: str) -> bool:
    """Add ``channel`` to ``group`` again (refreshing its expiry); False when it was missing.
    Layers other than channels-redis (the embedded in-memory one) lose nothing: always True."""
    if not hasattr(layer, "_group_key"):
        await layer.group_add(group, channel)
        return True
    key = layer._group_key(group)
    connection = layer.connection(layer.consistent_hash(group))
    added = await connection.zadd(key, {channel: time.time()})
    await connection.expire(key, layer.group_expiry)
    return added == 0


async def watch(consumer) -> None:
    """Until the socket closes: every THUNDERSYNC_WS_GROUP_CHECK_S, rejoin the group and send
    the socket a probe through the layer; a lost membership, a probe that did not come back
    within two checks (the layer's receive path is stuck) or an unreachable layer closes the
    socket with 4503 (the page resumes)."""
    sent = 0
    while not consumer.closing:
        await asyncio.sleep(settings.THUNDERSYNC_WS_GROUP_CHECK_S)
        if consumer.closing:
            return
        try:
            if consumer.probes_back < sent - 1:  # one check late is a busy daphne; two, a stuck receive
                err: Exception = MembershipLost("a probe sent through the channel layer never came back")
            elif await rejoin(consumer.channel_layer, consumer.group, consumer.channel_name):
                sent += 1
                await consumer.channel_layer.send(consumer.channel_name, {"type": "run.probe", "n": sent})
                continue
            else:
                err = MembershipLost(f"{consumer.group} had forgotten this socket (a Redis restart)")
        except (*OUTAGE_ERRORS, OSError) as error:
            err = error
        await consumer.refuse_for_now("channel layer", err)
        return
