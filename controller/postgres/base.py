"""Django's PostgreSQL backend whose connection pool answers at once while the database is down.

With Django's own pool (psycopg_pool) a request that finds no usable connection waits the
pool's full timeout (THUNDERSYNC_DB_POOL_TIMEOUT_S, 5 s) for one, and the outage middleware
tried a GET twice more: 10-15 s per answer while PostgreSQL was stopped. The pool's reconnect
attempts also back off exponentially (1, 2, 4, ... 64 s), so after a 30 s outage it could stay
empty for half a minute more with the server back up.

``FailFastPool`` remembers whether its last attempt to open a connection failed (the server
refused, was starting or shutting down, did not answer within the connect timeout): while it
did, one request at a time takes a pooled connection that still works or else tries to open one
itself (handed to the pool if it opens; if not, that request raises ``DatabaseUnreachable`` at
once), and the others wait at most
THUNDERSYNC_DB_DOWN_WAIT_S for a connection before they raise it too; the outage middleware
answers it with 503 and Retry-After. Otherwise the wait is
the pool's timeout as before (a pool whose connections are all busy is not an outage), cut into
short slices so that a request already waiting when the server goes away stops waiting too.
Reconnect attempts give up after ``reconnect_timeout`` (settings: 0.5 s), so no attempt is
scheduled far ahead: the next request tries again, and the pool refills within about a second
of the server coming back. Any connection obtained (checked first: CONN_HEALTH_CHECKS) or
opened clears the state.
"""

from __future__ import annotations

import threading
from time import monotonic

import psycopg
from django.conf import settings
from django.db.backends.postgresql import base
from psycopg_pool import ConnectionPool, PoolTimeout

SLICE_S = 0.25  # a waiting request looks this often whether the database went away meanwhile


class DatabaseUnreachable(PoolTimeout):
    """No connection: the pool's last attempt to open one failed and none came in the short wait
    (a PoolTimeout, so whatever handles the pool's timeout handles this too)."""


class FailFastPool(ConnectionPool):
    """psycopg_pool's pool that stops waiting once it knows the database is down (module doc)."""

    unreachable: BaseException | None = None  # the last connection attempt's error, until one succeeds
    _probing = threading.Lock()  # one request at a time tries the server itself while it is down

    def _connect(self, timeout: float | None = None):
        try:
            conn = super()._connect(timeout)
        except Exception as err:
            self.unreachable = err
            raise
        self.unreachable = None
        return conn

    def _probe(self) -> bool:
        """While the database is down: one attempt to open a connection now, in this thread (the
        pool's own attempts may be a second away), handed to the pool if it opens. When every slot
        of the pool is open or being opened, the connection only tells whether the server is back
        and is closed again. False: it failed."""
        with self._lock:
            full = self._nconns >= self._max_size
            if not full:
                self._nconns += 1
        try:
            conn = self._connect()  # clears ``unreachable`` if it opens
        except Exception:
            if not full:
                with self._lock:
                    self._nconns -= 1
            return False
        if full:
            conn._pool = None
            conn.close()
        else:
            self._add_to_pool(conn)
        return True

    def getconn(self, timeout: float | None = None):
        total = self.timeout if timeout is None else timeout
        deadline = monotonic() + total
        while True:
            if self.unreachable is not None and self._probing.acquire(blocking=False):
                try:
                    try:  # a pooled connection that still works comes first (new ones may be refused)
                        conn = super().getconn(0.001)
                    except PoolTimeout:
                        conn = None
                    if conn is None and not self._probe():
                        raise DatabaseUnreachable(f"the database is unreachable: {first_line(self.unreachable)}")
                finally:
                    self._probing.release()
                if conn is not None:
                    self.unreachable = None
                    return conn
            known_down = self.unreachable is not None
            wait = min(deadline - monotonic(), settings.THUNDERSYNC_DB_DOWN_WAIT_S if known_down else SLICE_S)
            try:
                conn = super().getconn(max(wait, 0.001))
            except PoolTimeout:
                if self.unreachable is not None:
                    raise DatabaseUnreachable(f"the database is unreachable: {first_line(self.unreachable)}") from None
                if monotonic() >= deadline:
                    raise PoolTimeout(f"couldn't get a connection after {total:.2f} sec") from None
                continue
            self.unreachable = None
            return conn


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


class DatabaseWrapper(base.DatabaseWrapper):
    @property
    def pool(self):
        """Django's pool, built by Django from the settings (not opened yet the first time), as a
        FailFastPool: the class adds behaviour, no state of its own to initialise."""
        pool = super().pool
        if pool is not None and type(pool) is ConnectionPool:
            pool.__class__ = FailFastPool
        return pool
