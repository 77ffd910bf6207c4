"""Which storage and brokers each settings module picks, and the compose file's validity."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

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
    assert settings["layer"] == "controller.live.embedded_layer.EmbeddedChannelLayer"
    assert settings["broker"] == "memory://"
    assert (settings["queue"], settings["prefetch"], settings["acks_late"]) == ("runs", 1, True)


def test_production_reads_postgres_and_redis_from_the_environment():
    out = probe({"DJANGO_SETTINGS_MODULE": "controller.settings.production", "DJANGO_SECRET_KEY": "k" * 50,
                 "DATABASE_URL": "postgres://ts:pw@db.internal:5433/lab", "REDIS_URL": "redis://cache:6379/1"})
    settings = json.loads(out.stdout.splitlines()[-1])
    # Django's PostgreSQL backend, its pool answering at once while the database is down (controller/postgres/)
    assert (settings["db"], settings["name"], settings["host"]) == ("controller.postgres", "lab", "db.internal")
    assert settings["layer"] == "controller.live.channel_layer.QuietCleanupRedisChannelLayer"
    assert settings["broker"] == "redis://cache:6379/1"


def test_production_refuses_to_start_without_a_secret_key():
    out = probe({"DJANGO_SETTINGS_MODULE": "controller.settings.production", "DJANGO_SECRET_KEY": ""})
    assert out.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in out.stderr


def deploy_check(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
    production = {"DJANGO_SETTINGS_MODULE": "controller.settings.production",
                  "DJANGO_SECRET_KEY": "a-long-random-secret-" + "q7Zr2xKp9Lm4Vt8Wn3Bs6Hd1" * 2,
                  "DJANGO_ALLOWED_HOSTS": "lab.example.com", "DJANGO_CSRF_TRUSTED_ORIGINS": "https://lab.example.com"}
    return subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"], cwd=ROOT,
                          env={**clean, **production, **env}, capture_output=True, text=True, timeout=120)


def test_production_passes_the_deploy_check_with_https():
    out = deploy_check()
    assert out.returncode == 0, out.stderr
    assert "no issues" in out.stdout


def test_the_deploy_check_catches_plain_http():
    """The check above is meaningful: the plain-HTTP trial mode fails it on exactly the
    HTTPS settings (HSTS, SSL redirect, secure session and CSRF cookies)."""
    out = deploy_check(DJANGO_HTTPS="0")
    assert out.returncode != 0
    for warning in ("W004", "W008", "W012", "W016"):
        assert warning in out.stderr


def test_the_image_runs_as_an_unprivileged_user():
    users = [line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")


def test_the_image_installs_bubblewrap():
    installs = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if "apt-get install" in line]
    assert any("bubblewrap" in line.split() for line in installs), installs


COMPOSE = shutil.which("docker-compose")


def compose_config(**env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_PASSWORD", "DJANGO_SECRET_KEY")}
    return subprocess.run([COMPOSE, "-f", str(ROOT / "docker-compose.yml"), "config"], capture_output=True,
                          text=True, timeout=60, env={**clean, **env}, cwd=ROOT)


@pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed")
def test_docker_compose_config_is_valid():
    out = compose_config(POSTGRES_PASSWORD="pw-from-the-operator", DJANGO_SECRET_KEY="key-from-the-operator")
    assert out.returncode == 0, out.stderr
    assert "pw-from-the-operator" in out.stdout and "key-from-the-operator" in out.stdout
    services = yaml.safe_load(out.stdout)["services"]
    # runs that span nodes (docs/distributed-nodes.md): node a takes runs and runs.a, node b only runs.b
    for name, node, queues in (("worker", "a", "runs,runs.a"), ("worker-node-b", "b", "runs.b")):
        worker = services[name]
        assert worker["environment"]["THUNDERSYNC_NODE"] == node and f"-Q {queues} " in worker["command"]
        assert worker["environment"]["DJANGO_SETTINGS_MODULE"] == "controller.settings.production"
        # the python-sandbox's bwrap needs a user namespace and mounts, which Docker's default
        # seccomp and AppArmor profiles refuse (docs/controller.md, "Production")
        assert set(worker["security_opt"]) == {"seccomp:unconfined", "apparmor:unconfined"}
    assert "security_opt" not in services["web"]  # the web server runs no tool call
    # the optional Ray profile (docs/distributed-nodes.md, "Running on a cluster"): a head and a node joining it
    assert services["ray-head"]["profiles"] == services["ray-worker"]["profiles"] == ["ray"]
    assert services["ray-head"]["command"].startswith("ray start --head --port 6379 ")
    assert "--address ray-head:6379" in services["ray-worker"]["command"]
    # a killed worker, web server or data store comes back by itself (docs/controller.md)
    assert {name: service.get("restart") for name, service in services.items()} == dict.fromkeys(
        services, "unless-stopped")


@pytest.mark.skipif(COMPOSE is None, reason="Debian's docker-compose is not installed")
@pytest.mark.parametrize("missing", ["POSTGRES_PASSWORD", "DJANGO_SECRET_KEY"])
def test_docker_compose_has_no_default_secrets(missing):
    env = {"POSTGRES_PASSWORD": "pw", "DJANGO_SECRET_KEY": "key"}
    del env[missing]
    out = compose_config(**env)
    assert out.returncode != 0
    assert missing in out.stderr
