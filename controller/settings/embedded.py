"""The default: one process, nothing to install beyond Python packages.

SQLite in WAL mode (the web threads and the embedded worker thread write concurrently),
an in-memory channel layer that accepts sends from the worker thread, and Celery's
in-memory broker, which only works inside one process (the `demo` command's worker thread).
"""

from .base import *  # noqa: F403
from .base import BASE_DIR

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "thundersync.sqlite3",
        "OPTIONS": {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}

CHANNEL_LAYERS = {"default": {"BACKEND": "controller.embedded_layer.EmbeddedChannelLayer"}}

CELERY_BROKER_URL = "memory://"
