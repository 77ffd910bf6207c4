"""Settings shared by every deployment; the modules next to this one pick storage and brokers.

embedded (the default): SQLite, in-memory channel layer, Celery worker thread in the web process.
production: PostgreSQL, Redis broker and channel layer, separate worker processes.
test: PostgreSQL and Redis on 127.0.0.1, as CI provides them.
"""

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "embedded-only-insecure-key-never-use-in-production")
DEBUG = os.environ.get("THUNDERSYNC_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "daphne",  # makes `manage.py runserver` serve ASGI (websockets) too
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "controller",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "controller.limits.outages.OutageMiddleware",  # innermost: it sees what views raise (503, not 500)
]

ROOT_URLCONF = "controller.urls"
ASGI_APPLICATION = "controller.asgi.application"
CSRF_FAILURE_VIEW = "controller.jsonapi.api_errors.csrf_failure"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "artifacts" / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
    # plotly.min.js comes from the installed plotly package, never a CDN.
    "controller.staticfinders.PlotlyFinder",
]

# Celery: runs go to their own queue, one at a time per worker process, acknowledged only
# after the task returns so a lost worker's run is redelivered (the task is idempotent).
CELERY_TASK_ROUTES = {"controller.tasks.run_training": {"queue": "runs"}}
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = True
# A pool process killed mid-run (OOM killer, kill -9) hands its message back at once; the
# redelivered task adopts the run its dead supervisor left (controller/tasks.py).
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# The learner: `thundersync train --config FILE --events -` writes JSONL events to stdout.
_console_script = Path(sys.executable).with_name("thundersync")
THUNDERSYNC_LEARNER_COMMAND = DEFAULT_LEARNER_COMMAND = (
    [str(_console_script)] if _console_script.exists() else [sys.executable, "-m", "learner.cli"]
)
# Runs of the default learner command are forked from a warm runner process that has torch and
# the trainer imported (controller/supervision/warm.py; docs/processes.md "Warm runner"); a run asked for
# while it still imports waits for it up to THUNDERSYNC_WARM_WAIT_S, then starts cold.
THUNDERSYNC_WARM_RUNNER = os.environ.get("THUNDERSYNC_WARM_RUNNER", "1") == "1"
THUNDERSYNC_WARM_WAIT_S = 60.0
THUNDERSYNC_RUN_DIR = Path(os.environ.get("THUNDERSYNC_RUN_DIR", BASE_DIR / "runs"))
# Directories a run config may load models from besides the built-ins (os.pathsep separated);
# none by default (controller/server_paths.py) ...
THUNDERSYNC_MODEL_ROOTS = [p for p in os.environ.get("THUNDERSYNC_MODEL_ROOTS", "").split(os.pathsep) if p]
# ... data sets from (task.path), and the custom rewards ('module:function') runs may use.
THUNDERSYNC_DATA_ROOTS = [p for p in os.environ.get("THUNDERSYNC_DATA_ROOTS", "").split(os.pathsep) if p]
THUNDERSYNC_REWARD_FUNCTIONS = [f for f in os.environ.get("THUNDERSYNC_REWARD_FUNCTIONS", "").split(",") if f]
THUNDERSYNC_CANCEL_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this many seconds
THUNDERSYNC_INGEST_FLUSH_S = 0.1  # batch DB writes and websocket frames at most this long (span-to-page p95 <= 250 ms needs <= 0.1, bench/web/web_latency.py)
THUNDERSYNC_INGEST_FLUSH_SPANS = 500  # ... or this many spans, whichever comes first
# The app's per-run threads (the learner's output readers, the live publisher) run at this nice
# value, so the CPU they take while a run trains is the run's idle time (controller/supervision/priority.py).
THUNDERSYNC_APP_NICE = os.environ.get("THUNDERSYNC_APP_NICE", "10")
if not THUNDERSYNC_APP_NICE.isdigit() or int(THUNDERSYNC_APP_NICE) > 19:
    raise SystemExit(f"THUNDERSYNC_APP_NICE: expected a nice value 0-19, got {THUNDERSYNC_APP_NICE!r}")
THUNDERSYNC_APP_NICE = int(THUNDERSYNC_APP_NICE)
THUNDERSYNC_CANCEL_POLL_S = 0.5  # how often the supervisor re-reads the cancel flag
THUNDERSYNC_STDERR_TAIL_LINES = 20  # kept for the error text of a failed run
# A viewer with more unacknowledged websocket bytes than this is closed (4408) and resumes with
# ?after; the replay keeps at most half of it in flight (controller/live/consumers.py).
THUNDERSYNC_WS_BACKLOG_BYTES = int(os.environ.get("THUNDERSYNC_WS_BACKLOG_BYTES", 4 * 2**20))
# Live frames wait in a socket's own inbox while it sends the previous ones (controller/live/fanout.py);
# one holding this many is too slow for its run's frames: closed 4408, it resumes from the database.
THUNDERSYNC_WS_INBOX_FRAMES = 2000
# Websockets one user may hold open in one server process; the next is accepted and closed 4429.
THUNDERSYNC_WS_PER_USER = int(os.environ.get("THUNDERSYNC_WS_PER_USER", "32"))
# No run without an owner (docs/controller.md): the supervisor stamps its run every
# HEARTBEAT_S; a run whose stamp is older than STALE_S (and whose supervising process is
# gone, where this host can tell) is ended or resumed by the reaper, which every worker runs
# at start and every REAP_INTERVAL_S. A queued run whose message the broker no longer holds
# is sent again once it has waited REQUEUE_AFTER_S.
THUNDERSYNC_HEARTBEAT_S = 2.0
THUNDERSYNC_STALE_S = 20.0
# Runs that span nodes (docs/distributed-nodes.md): this worker's node name (it consumes queue
# runs.<node>) and the address other nodes reach it at (rank 0's rendezvous and control port).
THUNDERSYNC_NODE = os.environ.get("THUNDERSYNC_NODE", "local")
THUNDERSYNC_NODE_ADDR = os.environ.get("THUNDERSYNC_NODE_ADDR", "127.0.0.1")
# The node registry (controller/supervision/nodes.py): a launch may name in learner.nodes only a node some
# worker stamped (at its start, then every REAP_INTERVAL_S) within this many seconds.
THUNDERSYNC_NODE_TTL_S = float(os.environ.get("THUNDERSYNC_NODE_TTL_S", "60"))
if THUNDERSYNC_NODE_ADDR == "auto":  # the address this host's name resolves to (a container's own)
    import socket

    THUNDERSYNC_NODE_ADDR = socket.gethostbyname(socket.gethostname())
THUNDERSYNC_REAP_INTERVAL_S = 10.0
# Request bodies are refused with 413 past this many bytes while they arrive (controller/limits/body_limit.py).
THUNDERSYNC_MAX_REQUEST_BYTES = 4 * 1024 * 1024
# The web process (controller/asgi.py) reaps too, so a run whose worker died is resumed or
# failed even while no worker is up. Production turns it on; the embedded demo has its own.
THUNDERSYNC_WEB_REAPER = os.environ.get("THUNDERSYNC_WEB_REAPER", "0") == "1"
THUNDERSYNC_REQUEUE_AFTER_S = 30.0
THUNDERSYNC_AUTO_RESUMES = 2  # a run whose supervisor is gone resumes from its checkpoint this often, then fails
# The learner reports at least every few seconds while it trains; silence this long means
# it hangs (a stuck tool, a blocked pipe): the run fails with that reason.
THUNDERSYNC_PROGRESS_TIMEOUT_S = 600.0
THUNDERSYNC_DB_RETRY_MAX_S = 5.0  # backoff ceiling while the database is unreachable
THUNDERSYNC_DB_OUTAGE_LIMIT_S = 600.0  # past this the supervisor gives up (the reaper ends the run)

# Per-user quotas (controller/limits/quotas.py); a UserQuota row in the admin overrides them per user.
THUNDERSYNC_QUOTA_DEFAULTS = {
    "trajectories_per_step": 1024,  # train.prompts_per_step × train.group_size
    "steps": 10_000,  # train.steps of one run
    "concurrent_runs": 2,  # more wait queued; the dispatcher interleaves users (controller/supervision/dispatch.py)
    "queued_runs": 10,
    # processes and generated items of one run (controller/limits/quotas.py RESOURCE_LIMITS)
    "rollout_workers": 8,  # rollout.workers, and rollout.replicas (vLLM)
    "learner_world_size": 4,  # learner.world_size
    "task_size": 100_000,  # task.size (reasoning-gym items per split)
    # cost (controller/limits/run_cost.py): rollout processes + learner ranks; sampled tokens of a step
    # (trajectories × (prompt + max_new_tokens × max_turns)); any number in a reasoning-gym
    # dataset's options; checkpoints kept (train.keep_checkpoints)
    "processes": 12,
    "tokens_per_step": 4_194_304,
    "generator_setting": 100,
    "keep_checkpoints": 10,
    "disk_mb": 50_000,  # what a user's run directories hold (controller/limits/disk_quota.py)
    "gpus": 8,  # GPUs of one run (controller/limits/run_cost.py gpus): one 8-GPU node
}
# Objects a user may keep stored (controller/limits/quotas.py check_stored): past either, creating
# another is refused (409) naming the limit.
THUNDERSYNC_MAX_EXPERIMENTS_PER_USER = int(os.environ.get("THUNDERSYNC_MAX_EXPERIMENTS_PER_USER", "500"))
THUNDERSYNC_MAX_RUNS_PER_USER = int(os.environ.get("THUNDERSYNC_MAX_RUNS_PER_USER", "5000"))
THUNDERSYNC_DISK_CHECK_S = 30.0  # how often a run's supervisor measures its owner's disk use

# Login throttling (controller/limits/login_throttle.py): failures counted per (account, address)
# and per address; past a limit each attempt waits a cool-down after the last failure.
THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ACCOUNT = 5
THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS = 20
THUNDERSYNC_LOGIN_WINDOW_S = 15 * 60
THUNDERSYNC_LOGIN_COOLDOWN_S = 30.0  # first cool-down past a limit; doubles per further failure
# Behind a reverse proxy: the META key of the header it sets to the client's address (e.g.
# "HTTP_X_REAL_IP"); only a header the proxy overwrites, a client could forge any other.
THUNDERSYNC_CLIENT_IP_HEADER = os.environ.get("THUNDERSYNC_CLIENT_IP_HEADER", "")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"controller": {"handlers": ["console"], "level": "INFO"}},
}


# Bounded connections (docs/controller-faults.md, "Connections"): each process opens PostgreSQL through
# a pool of at most THUNDERSYNC_DB_POOL_MAX connections (a thread returns its connection when
# a request, a websocket query or a reaper pass ends; a run's supervisor holds one for the run,
# so a worker process needs its run threads + 2); a thread that finds every connection taken
# waits up to THUNDERSYNC_DB_POOL_TIMEOUT_S, then its request answers 503 (a supervisor tries again
# later; THUNDERSYNC_STALE_S must stay well above this wait, docs/controller-faults.md "Connections").
THUNDERSYNC_DB_POOL_MAX = int(os.environ.get("THUNDERSYNC_DB_POOL_MAX", "8"))
THUNDERSYNC_DB_POOL_TIMEOUT_S = float(os.environ.get("THUNDERSYNC_DB_POOL_TIMEOUT_S", "5"))
# While the pool's last attempt to open a connection failed (the database is down), a thread
# waits only this long for one, then its request answers 503 at once (controller/postgres/base.py);
# reconnect attempts give up after THUNDERSYNC_DB_RECONNECT_S instead of backing off for minutes
# (the next request tries again), and one attempt waits at most THUNDERSYNC_DB_CONNECT_TIMEOUT_S
# for the server (libpq's minimum is 2 s).
THUNDERSYNC_DB_DOWN_WAIT_S = float(os.environ.get("THUNDERSYNC_DB_DOWN_WAIT_S", "0.5"))
THUNDERSYNC_DB_RECONNECT_S = float(os.environ.get("THUNDERSYNC_DB_RECONNECT_S", "0.5"))
THUNDERSYNC_DB_CONNECT_TIMEOUT_S = int(os.environ.get("THUNDERSYNC_DB_CONNECT_TIMEOUT_S", "2"))
# A server process checks this often that the channel layer still holds it in each run's group it
# feeds sockets from (a Redis restart forgets every group) and asks their pages to reconnect from
# their last seq if not (controller/live/fanout.py).
THUNDERSYNC_WS_GROUP_CHECK_S = 5.0
# Redis clients (channel layer, cache): a connect to a Redis that is down or unreachable fails
# within this many seconds instead of the system's minutes; idle connections are PINGed before
# reuse past REDIS_HEALTH_CHECK_S, so a restarted server's dead sockets are replaced, not used.
REDIS_CONNECT_TIMEOUT_S = 3
REDIS_HEALTH_CHECK_S = 10


def postgres_database(**fields) -> dict:
    """A PostgreSQL ``DATABASES`` entry through Django's psycopg pool: at most
    THUNDERSYNC_DB_POOL_MAX connections per process, one kept open while idle, each checked
    before a thread takes it (a terminated backend is replaced, not handed out), none waited for
    while the database is down (controller/postgres/base.py);
    THUNDERSYNC_DB_POOL_MAX=0: no pool, a connection per request."""
    connect = {"connect_timeout": THUNDERSYNC_DB_CONNECT_TIMEOUT_S}
    if THUNDERSYNC_DB_POOL_MAX == 0:
        return {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True, **fields,
                "OPTIONS": connect}
    return {  # Django's backend, its pool answering at once while the database is down (controller/postgres/)
        "ENGINE": "controller.postgres", "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": True, **fields,
        "OPTIONS": {**connect, "pool": {"min_size": 1, "max_size": THUNDERSYNC_DB_POOL_MAX, "max_idle": 60.0,
                                        "timeout": THUNDERSYNC_DB_POOL_TIMEOUT_S,
                                        "reconnect_timeout": THUNDERSYNC_DB_RECONNECT_S}},
    }


def redis_options() -> dict:
    return {"socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S, "socket_keepalive": True,
            "health_check_interval": REDIS_HEALTH_CHECK_S}


def redis_channel_layers(url: str, prefix: str = "asgi") -> dict:
    """channels-redis on ``url``. Its receive blocks in BZPOPMIN for 5 s, and redis-py 8's
    default socket timeout is also 5 s: the read would race the timeout and kill the
    consumer, so the socket gets a timeout well above the blocking pop. Every socket of one
    daphne shares one inbox list, and a group send silently skips an inbox holding
    ``capacity`` messages: at the default 100, a busy daphne with a few dozen viewers lost a
    run's last frames (its final status), so the inbox may hold far more; a viewer that falls
    behind is closed by its own byte limit instead (THUNDERSYNC_WS_BACKLOG_BYTES). The layer's
    backup-queue cleanup says an outage in one line, not a traceback (controller/live/channel_layer.py)."""
    return {
        "default": {
            "BACKEND": "controller.live.channel_layer.QuietCleanupRedisChannelLayer",
            "CONFIG": {"hosts": [{"address": url, "socket_timeout": 30, **redis_options()}], "prefix": prefix,
                       "capacity": 10_000},
        }
    }
