"""Request bodies capped while they arrive, before anything buffers them.

daphne hands a request to the application only once its whole body has been received, and
then queues every chunk of it in memory at once: a 1 GB chunked body (anonymous, refused by
CSRF afterwards) costs the web process a gigabyte of RSS first. No request of this app needs
more than a few megabytes (configs are at most 100,000 characters; Django refuses bodies over
DATA_UPLOAD_MAX_MEMORY_SIZE anyway), so daphne's request class is given a byte count: past
``THUNDERSYNC_MAX_REQUEST_BYTES`` the request is answered ``413`` (JSON) and its connection
closed, and nothing more of the body is kept. ``install`` is called by controller/asgi.py, so
it applies to every daphne serving the app; other servers keep their own limits.
"""

from __future__ import annotations

import json

from daphne.http_protocol import WebRequest

_ORIGINAL = WebRequest.handleContentChunk


def refusal(limit: int) -> bytes:
    body = json.dumps({"errors": {"body": f"request body larger than {limit} bytes"}}).encode()
    return (b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))


def install(limit: int) -> None:
    def handleContentChunk(self, data: bytes) -> None:  # noqa: N802 (twisted's name)
        received = getattr(self, "_thundersync_received", 0) + len(data)
        self._thundersync_received = received
        if received <= limit:
            _ORIGINAL(self, data)
        elif not getattr(self, "_thundersync_refused", False):
            self._thundersync_refused = True
            self.content.truncate(0)  # what was kept of it
            self.channel.transport.write(refusal(limit))
            self.channel.transport.loseConnection()

    WebRequest.handleContentChunk = handleContentChunk
