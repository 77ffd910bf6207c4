"""The default: one process, nothing to install beyond Python packages.

SQLite in WAL mode (the web threads and the embedded worker thread write concurrently),
an in-memory channel layer that accepts sends from the worker thread, and Celery's
in-memory broker, which only works inside one process (the `demo` command's worker thread).
"""

import os

from controller.settings.base import *  # noqa: F403
from controller.settings.base import BASE_DIR

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("THUNDERSYNC_SQLITE", BASE_DIR / "thundersync.sqlite3"),  # bench/web/first_span.py: a temp file
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}

CHANNEL_LAYERS = {"default": {"BACKEND": "controller.live.embedded_layer.EmbeddedChannelLayer"}}

CELERY_BROKER_URL = "memory://"
# The in-memory transport polls its queues; at the default 1 s a launched run waited ~1 s to be
# claimed (bench/web/first_span.py). An idle poll is a dict lookup.
CELERY_BROKER_TRANSPORT_OPTIONS = {"polling_interval": 0.05}
