"""PostgreSQL (psycopg 3), Redis broker and channel layer, separate worker processes.

Environment: DJANGO_SECRET_KEY (required), DJANGO_ALLOWED_HOSTS (comma separated),
DATABASE_URL (postgres://user:pass@host:port/name) or PGHOST/PGPORT/PGUSER/PGPASSWORD/
PGDATABASE, REDIS_URL (redis://host:6379/0), DJANGO_HTTPS (default 1: served over HTTPS,
usually TLS ended by a proxy that sets X-Forwarded-Proto; 0 only for a plain-HTTP trial),
DJANGO_HSTS_SECONDS (default one year).
"""

import os
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

from controller.settings.base import *  # noqa: F403
from controller.settings.base import postgres_database, redis_channel_layers, redis_options


def _require(name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise ImproperlyConfigured(f"{name} must be set for controller.settings.production")
    return value


def _database_from_env() -> dict:
    url = os.environ.get("DATABASE_URL", "")
    if url:
        parts = urlparse(url)
        if parts.scheme not in ("postgres", "postgresql"):
            raise ImproperlyConfigured(f"DATABASE_URL: expected postgres://, got {parts.scheme}://")
        return {
            "NAME": parts.path.lstrip("/") or "thundersync",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    return {
        "NAME": os.environ.get("PGDATABASE", "thundersync"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
        "HOST": os.environ.get("PGHOST", ""),
        "PORT": os.environ.get("PGPORT", ""),
    }


SECRET_KEY = _require("DJANGO_SECRET_KEY")
DEBUG = False
ALLOWED_HOSTS = [h.strip() for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost").split(",") if h.strip()]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

# Through a pool of at most THUNDERSYNC_DB_POOL_MAX connections per process (settings/base.py);
# a pooled connection is checked before a thread takes it (a restarted or terminated backend is
# replaced instead of failing the request).
DATABASES = {"default": postgres_database(**_database_from_env())}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = redis_channel_layers(REDIS_URL)
CELERY_BROKER_URL = REDIS_URL
# With acks_late, Redis hands an unacknowledged message out again after the visibility
# timeout: that is how the message of a worker that vanished comes back. A redelivery while
# the run's supervisor is alive finds its heartbeat fresh and is dropped (controller/tasks.py),
# so the timeout only bounds how long a lost message waits; the reaper ends or resumes the
# run itself well before (docs/controller.md).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 600, **redis_options()}
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # a worker waits out a Redis restart however long, then consumes again

CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "OPTIONS": redis_options()}}
THUNDERSYNC_WEB_REAPER = os.environ.get("THUNDERSYNC_WEB_REAPER", "1") == "1"  # settings/base.py

# HTTPS (docs/controller.md, "Production"): `manage.py check --deploy` is clean with these.
HTTPS = os.environ.get("DJANGO_HTTPS", "1") != "0"
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = HTTPS
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", 365 * 24 * 3600)) if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = HTTPS
SECURE_HSTS_PRELOAD = HTTPS
