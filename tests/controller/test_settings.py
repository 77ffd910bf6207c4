"""Which storage and brokers each settings module picks, and the compose file's validity."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT

PROBE = (
    "import json; from django.conf import settings as s; "
    "print(json.dumps({'db': s.DATABASES['default']['ENGINE'], 'name': str(s.DATABASES['default']['NAME']), "
    "'host': s.DATABASES['default'].get('HOST', ''), 'layer': s.CHANNEL_LAYERS['default']['BACKEND'], "
    "'broker': s.CELERY_BROKER_URL, 'queue': s.CELERY_TASK_ROUTES['controller.tasks.run_training']['queue'], "
    "'prefetch': s.CELERY_WORKER_PREFETCH_MULTIPLIER, 'acks_late': s.CELERY_TASK_ACKS_LATE}))"
)


def probe(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    # Through manage.py, which picks the default settings module when none is given.
    return subprocess.run([sys.executable, "manage.py", "shell", "-c", PROBE], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def test_the_default_is_embedded():
    out = probe({})
    settings = json.loads(out.stdout.splitlines()[-1])
    assert settings["db"] == "django.db.backends.sqlite3"
    assert settings["layer"] == "controller.embedded_layer.EmbeddedChannelLayer"
    assert settings["broker"] == "memory://"
    assert (settings["queue"], settings["prefetch"], settings["acks_late"]) == ("runs", 1, True)


def test_production_reads_postgres_and_redis_from_the_environment():
    out = probe({"DJANGO_SETTINGS_MODULE": "controller.settings.production", "DJANGO_SECRET_KEY": "k" * 50,
                 "DATABASE_URL": "postgres://ts:pw@db.internal:5433/lab", "REDIS_URL": "redis://cache:6379/1"})
    settings = json.loads(out.stdout.splitlines()[-1])
    assert (settings["db"], settings["name"], settings["host"]) == ("django.db.backends.postgresql", "lab",
                                                                    "db.internal")
    assert settings["layer"] == "channels_redis.core.RedisChannelLayer"
    assert settings["broker"] == "redis://cache:6379/1"


def test_production_refuses_to_start_without_a_secret_key():
    out = probe({"DJANGO_SETTINGS_MODULE": "controller.settings.production", "DJANGO_SECRET_KEY": ""})
    assert out.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in out.stderr


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="Debian's docker-compose is not installed")
def test_docker_compose_config_is_valid():
    out = subprocess.run(["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
