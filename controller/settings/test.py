"""CI: PostgreSQL and Redis on 127.0.0.1 (the CI script starts them), a real Celery worker.

Several test runs may share those servers (suites run side by side), so the test database,
the broker keys and the channel-layer keys carry a per-run tag. Child
processes inherit the tag through the environment.
"""

import os

from controller.settings.base import *  # noqa: F403
from controller.settings.base import postgres_database, redis_channel_layers

# pytest-xdist workers share the controller's environment, so each adds its worker id.
TEST_TAG = os.environ.setdefault("THUNDERSYNC_TEST_TAG", str(os.getpid()))
if os.environ.get("PYTEST_XDIST_WORKER") and not TEST_TAG.endswith(os.environ["PYTEST_XDIST_WORKER"]):
    TEST_TAG = os.environ["THUNDERSYNC_TEST_TAG"] = f"{TEST_TAG}_{os.environ['PYTEST_XDIST_WORKER']}"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",  # only used to create and drop the test database below
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "5432",
        "TEST": {"NAME": f"test_thundersync_{TEST_TAG}"},
    }
}
# A server process started by a test (a Celery worker, tests/controller/faults.py; daphne,
# tests/harness/web_harness.py) opens this test run's database directly, through the pool
# production uses (settings/base.py); the pytest process itself keeps plain connections.
if os.environ.get("THUNDERSYNC_TEST_DATABASE"):
    DATABASES["default"] = postgres_database(NAME=os.environ["THUNDERSYNC_TEST_DATABASE"], USER="postgres",
                                             HOST="127.0.0.1", PORT="5432")
    # A supervisor waiting for a pooled connection does not touch its liveness file meanwhile: with
    # THUNDERSYNC_STALE_S = 4 s below, a 5 s wait on a flapping database got a live run reaped. So
    # a test's workers wait 1 s; its daphne (tests/harness/web_harness.py) says how long it waits.
    DATABASES["default"]["OPTIONS"]["pool"]["timeout"] = float(os.environ.get("THUNDERSYNC_TEST_DB_POOL_TIMEOUT_S", "1.0"))

REDIS_URL = os.environ.get("THUNDERSYNC_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CHANNEL_LAYERS = redis_channel_layers(REDIS_URL, prefix=f"asgi-test-{TEST_TAG}")
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": f"celery-test-{TEST_TAG}:", "visibility_timeout": 600}

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
THUNDERSYNC_CANCEL_GRACE_S = 2.0
# Short ownership timings so the fault-injection suite (tests/controller/test_faults.py)
# reaches every final state within seconds.
THUNDERSYNC_HEARTBEAT_S = 0.5
THUNDERSYNC_STALE_S = 4.0
THUNDERSYNC_REAP_INTERVAL_S = 1.0
THUNDERSYNC_REQUEUE_AFTER_S = 3.0
# Runs start cold unless a test asks for the warm runner (tests/controller/test_warm_runner.py):
# one more torch-importing process per worker would slow every other test on 2 cores.
THUNDERSYNC_WARM_RUNNER = False
