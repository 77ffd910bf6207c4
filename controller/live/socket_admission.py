"""Which run websockets are let in, how the others are turned away, and the close codes the page knows.

The origin is checked at the handshake, before any consumer runs (controller/live/origins.py). Past
it, ``AdmittedSocket`` lets a socket in when its user is logged in and has fewer than
``THUNDERSYNC_WS_PER_USER`` sockets open in this server process, and counts it against that
cap until it disconnects. Every socket turned away is accepted first, then closed with one of
the codes below (docs/web-contract.md, "Websocket"): a close before accept would reach the
browser as a bare HTTP 403, and the page could not tell an expired session from a network
drop. An outage of the database or the channel layer closes with ``CLOSE_TRY_AGAIN_LATER``,
never 1011 with a traceback. What an admitted socket is for is its subclass's
(``consumers.RunConsumer``: a run's replay and live frames).
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from controller.limits.outages import OUTAGE_ERRORS

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_BAD_REQUEST = 4400
CLOSE_TOO_SLOW = 4408  # the viewer fell THUNDERSYNC_WS_BACKLOG_BYTES behind: reconnect with ?after
# An infrastructure outage (database, channel layer): "try again later". Not the standard 1013:
# daphne's websocket library sends only 1000 and 3000-4999 (a 1013 reached the client as 1011).
CLOSE_TRY_AGAIN_LATER = 4503
# The user has THUNDERSYNC_WS_PER_USER sockets open in this server process already: final (the page
# does not reconnect; it asks to close other views and reload).
CLOSE_TOO_MANY = 4429
log = logging.getLogger(__name__)


# Open sockets per user, per event loop (daphne has one per process; each test its own): the
# consumers' ids, a user's entry removed with their last socket.
_open: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, set[int]]]" = weakref.WeakKeyDictionary()


def open_sockets() -> dict[int, set[int]]:
    """This process's open sockets by user id (the cap's count; tests and the load bench read it)."""
    return _open.setdefault(asyncio.get_running_loop(), {})


class AdmittedSocket(AsyncWebsocketConsumer):
    """A websocket of a logged-in user within their cap; ``admitted`` says what it does next."""

    accepted = False
    closing = False
    user_id: int | None = None  # set while the socket counts against its user's cap

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(CLOSE_UNAUTHENTICATED)
            return
        mine = open_sockets().setdefault(user.pk, set())
        if len(mine) >= settings.THUNDERSYNC_WS_PER_USER:
            if not mine:
                del open_sockets()[user.pk]
            await self.accept()
            await self.close(code=CLOSE_TOO_MANY, reason=(
                f"{len(mine)} live views open, the limit is {settings.THUNDERSYNC_WS_PER_USER} per user"))
            return
        mine.add(id(self))
        self.user_id = user.pk
        await self.admitted(user)

    async def admitted(self, user) -> None:
        """The socket is let in and counted against ``user``'s cap (until its disconnect)."""
        raise NotImplementedError

    async def refuse(self, code: int) -> None:
        """Accept, then close with ``code`` (see the module's docstring)."""
        await self.accept()
        await self.close(code=code)

    async def refuse_for_now(self, what: str, err: Exception) -> None:
        """Close with CLOSE_TRY_AGAIN_LATER: the page reconnects from its last seq."""
        log.warning("websocket: the %s is unreachable (%s); asking the client to reconnect", what, err)
        self.closing = True
        if self.accepted:
            await self.close(code=CLOSE_TRY_AGAIN_LATER)
        else:
            await self.refuse(CLOSE_TRY_AGAIN_LATER)

    async def accept(self, subprotocol=None, headers=None):
        self.accepted = True
        await super().accept(subprotocol, headers)

    async def __call__(self, scope, receive, send):
        """The channel layer failing inside the dispatch loop (its receive is part of the loop)
        closes the socket with CLOSE_TRY_AGAIN_LATER, not 1011 with a traceback."""
        try:
            await super().__call__(scope, receive, send)
        except (*OUTAGE_ERRORS, OSError) as err:
            log.warning("websocket: the channel layer is unreachable (%s); closing with %s", err, CLOSE_TRY_AGAIN_LATER)
            if not self.closing:
                self.closing = True
                try:
                    await send({"type": "websocket.close", "code": CLOSE_TRY_AGAIN_LATER})
                except Exception:  # noqa: BLE001 (the connection went with it: nothing left to tell)
                    pass

    async def disconnect(self, code):
        self.closing = True
        if self.user_id is not None:  # counted against the user's cap until now
            mine = open_sockets().get(self.user_id, set())
            mine.discard(id(self))
            if not mine:
                open_sockets().pop(self.user_id, None)
