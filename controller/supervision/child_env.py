"""The environment of every process a run starts (the learner, its rollout workers and the
warm runner they fork from; tool processes get an empty one, learner/tasks/sandbox.py):
the web app's and the worker's own minus their secrets. A learner never talks to the
database or the broker (it reports on stdout), so nothing it starts needs them, and code a
run executes (a reward function, a policy's tool call) cannot read them from
``/proc/<pid>/environ`` of an ancestor either (docs/tasks.md, "The sandbox's boundary")."""

import os
import re

# Names of settings the app reads from the environment that grant access (Django's key, the
# database and broker URLs, libpq's variables) and anything named like a credential.
SECRET = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|API_KEY|ACCESS_KEY|PRIVATE_KEY|DATABASE|REDIS|BROKER"
                    r"|^DJANGO_|^PG|^CELERY_|^AWS_")


def is_secret(name: str) -> bool:
    return bool(SECRET.search(name.upper()))


def run_environment(extra: dict[str, str] | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (this process's environment) without its secrets, then ``extra`` (what the
    run itself is given, e.g. a data-parallel run's rank key)."""
    source = os.environ if base is None else base
    return {**{k: v for k, v in source.items() if not is_secret(k)}, "PYTHONUNBUFFERED": "1", **(extra or {})}
