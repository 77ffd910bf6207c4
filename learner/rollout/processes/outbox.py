"""A rollout worker's messages to the driver, over a pipe of its own (docs/processes.md).

One pipe per worker, not one queue shared by all: a shared ``multiprocessing.Queue`` has
one write lock for every writer, and a worker killed with SIGKILL while its feeder thread
held it wedges every other worker's sends. Here the worker holds the only writing end of
its pipe (the driver closes its copy at spawn), so its death reads as end-of-file on the
driver's side and touches nobody else.

``put`` never blocks: a feeder thread writes (as ``multiprocessing.Queue``'s does), so the
agent loops keep generating while the driver is busy learning and the pipe is full.
Standard library only: the boot module uses it before torch is imported.
"""

from __future__ import annotations

import queue
import threading

_CLOSE = object()


class Outbox:
    def __init__(self, conn):
        self._conn = conn
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._feed, name="rollout-outbox", daemon=True)
        self._thread.start()

    def put(self, msg) -> None:
        self._queue.put(msg)

    def _feed(self) -> None:
        while (msg := self._queue.get()) is not _CLOSE:
            try:
                self._conn.send(msg)
            except OSError:
                return  # the driver is gone: nobody left to tell

    def flush(self, timeout_s: float) -> None:
        """Send what is queued (at most ``timeout_s``): a last ``Failed`` must reach the driver
        before the process exits. After ``Stop`` a worker exits without it (the driver reads
        nothing more, and a full pipe would hold the exit up)."""
        self._queue.put(_CLOSE)
        self._thread.join(timeout_s)
