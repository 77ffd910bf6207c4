"""In-memory channel layer usable from the embedded Celery worker thread.

Channels' ``InMemoryChannelLayer`` keeps ``asyncio.Queue`` objects that belong to the
server's event loop; a ``group_send`` from the worker thread's own loop would wake the
waiting consumer unsafely (asyncio is not thread-safe). Sends from a foreign loop are
therefore handed to the loop that receives, which is the ASGI server's.
"""

import asyncio

from channels.layers import InMemoryChannelLayer


class EmbeddedChannelLayer(InMemoryChannelLayer):
    _receiving_loop: asyncio.AbstractEventLoop | None = None

    async def receive(self, channel):
        self._receiving_loop = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel, message):
        await self._on_receiving_loop(super().send(channel, message))

    async def group_send(self, group, message):
        await self._on_receiving_loop(super().group_send(group, message))

    async def _on_receiving_loop(self, coro):
        home = self._receiving_loop
        if home is None or home.is_closed() or home is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, home))
