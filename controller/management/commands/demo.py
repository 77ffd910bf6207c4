"""``python manage.py demo``: the whole app in one process, ready to click through.

Migrates, creates a demo user (prints login, password and URL), global schedule presets
for the four schedules, a ready experiment from configs/quickstart.yaml and the two demo
experiments (``DEMOS``: configs/demo-balanced.yaml at balance, configs/demo-longtail.yaml
rollout-bound), each with its purpose in its description and a one-click comparison of the four
schedules (the compare form's defaults), starts a Celery worker thread (the embedded in-memory broker reaches only this process) and serves
HTTP + websockets with daphne.
"""

import re
import secrets
from functools import partial

import yaml
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from controller.broker import enqueue
from controller.models import Experiment, Run, Schedule

DEMO_USER = "demo"
DEMO_EXPERIMENT = "quickstart"
# configs/quickstart.yaml trains one step (a quick check of the install); the demo's runs are
# long enough for the charts to show a trend. Measured on this demo (2 cores, load ~6, two
# streaming runs through POST /api/runs/ once the warm runner was up): median step 0.50-0.53 s
# (0.26-2.0 s, the first step the longest), 14.5-16.6 s from launch to finished.
DEMO_STEPS = 20
DEMO_DESCRIPTION = (f"A tiny model on arith-tool, {DEMO_STEPS} GRPO steps per run: each step takes about half a "
                    "second on a CPU, a run 15-20 s from launch (longer while the worker is still booting).")
# Global presets: one per schedule kind; fully-async's staleness bound is its knob.
PRESETS = [
    ("sync", "sync", {}),
    ("async", "async", {}),
    ("fully-async", "fully-async", {"max_staleness": 2}),
    ("streaming", "streaming", {}),
]


# The demo experiments: (name, config file under configs/, what it shows). Their figures (steps,
# batch, tool latency) are the files' own, read when the experiment is made, never written here.
DEMOS = [
    ("demo: at balance", "demo-balanced.yaml",
     "At balance: the rollout's makespan R is about the learner's work L and the rewards arrive spread "
     "through the rollout, the regime where streaming hides the learner's work under the rollout and should "
     "reach async's step at zero staleness."),
    ("demo: rollout-bound long tail", "demo-longtail.yaml",
     "Rollout-bound long tail: a few tool calls take many times the median, so R is several times L; "
     "streaming can save at most the learner's work, and the lever is speculation (drafting while the "
     "engine idles in the tail)."),
]


def ensure_presets() -> list[Schedule]:
    presets = []
    for name, kind, knobs in PRESETS:
        schedule, _ = Schedule.objects.get_or_create(owner=None, name=name, defaults={"kind": kind, "knobs": knobs})
        presets.append(schedule)
    return presets


def ensure_demo_experiment(user) -> Experiment:
    path = settings.BASE_DIR / "configs" / "quickstart.yaml"
    try:
        text = demo_config_text(path.read_text())
        config = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as err:
        raise CommandError(f"cannot read the demo config {path}: {err}") from None
    experiment = Experiment.objects.filter(owner=user, name=DEMO_EXPERIMENT).first() or Experiment(
        owner=user, name=DEMO_EXPERIMENT)
    experiment.description = DEMO_DESCRIPTION
    experiment.config, experiment.config_text = config, text
    experiment.full_clean()
    experiment.save()
    return experiment


def demo_description(purpose: str, file: str, config: dict) -> str:
    """The purpose, the run's shape as the config file gives it, and what to click."""
    train, task = config.get("train") or {}, config.get("task") or {}
    shape = (f"{train.get('steps')} steps of {train.get('prompts_per_step')} prompts x {train.get('group_size')} "
             f"trajectories on {task.get('name')} (configs/{file}).")
    return (f"{purpose} {shape} \"Launch comparison\" with its defaults runs sync, async, fully-async and streaming "
            "side by side; a finished run's page shows what the simulator predicts for each schedule on its workload.")


def ensure_file_experiment(user, name: str, file: str, purpose: str) -> Experiment:
    """The experiment ``name`` of ``user`` from configs/``file`` as written (comments kept), made
    or brought up to date with the file."""
    path = settings.BASE_DIR / "configs" / file
    try:
        text = path.read_text()
        config = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as err:
        raise CommandError(f"cannot read the demo config {path}: {err}") from None
    experiment = Experiment.objects.filter(owner=user, name=name).first() or Experiment(owner=user, name=name)
    experiment.description = demo_description(purpose, file, config)
    experiment.config, experiment.config_text = config, text
    experiment.full_clean()
    experiment.save()
    return experiment


def ensure_demos(user) -> list[Experiment]:
    return [ensure_file_experiment(user, name, file, purpose) for name, file, purpose in DEMOS]


def demo_config_text(quickstart: str) -> str:
    """configs/quickstart.yaml as written (comments kept), with ``train.steps: DEMO_STEPS``."""
    body = [line for line in quickstart.splitlines(keepends=True) if not line.startswith("#")]
    steps = re.sub(r"(?m)^(\s+steps:)\s*\d+", rf"\g<1> {DEMO_STEPS}", "".join(body), count=1)
    return f"# The demo experiment: configs/quickstart.yaml with {DEMO_STEPS} steps per run.\n{steps}"


def recover_runs() -> int:
    """The in-memory broker forgets everything when the process ends: runs a previous demo
    left in flight failed with it, and queued ones are queued again (the task is idempotent)."""
    Run.objects.filter(status__in=[Run.Status.STARTING, Run.Status.RUNNING]).update(
        status=Run.Status.FAILED, error="the embedded server stopped during the run", finished=timezone.now()
    )
    queued = list(Run.objects.filter(status=Run.Status.QUEUED).values_list("pk", "celery_task_id"))
    for run_id, task_id in queued:
        enqueue(run_id, task_id)
    return len(queued)


def where_data_is() -> str:
    """Where this demo keeps its data, and the variables that move it (a second, separate demo
    sets both and another --port)."""
    database = settings.DATABASES["default"]["NAME"]
    return (f"database: {database} (THUNDERSYNC_SQLITE)\n"
            f"run files: {settings.THUNDERSYNC_RUN_DIR} (THUNDERSYNC_RUN_DIR)")


class Command(BaseCommand):
    help = "Set up a demo user and experiment, start an embedded Celery worker and serve on 127.0.0.1:8000."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--setup-only", action="store_true", help="prepare the database and user, serve nothing")

    def handle(self, *args, host, port, setup_only, **options):
        call_command("migrate", interactive=False, verbosity=0)
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(username=DEMO_USER)
        user.set_password(password)  # a fresh password each start, printed below
        user.save()
        ensure_presets()
        experiment = ensure_demo_experiment(user)
        demos = ensure_demos(user)
        url = f"http://{host}:{port}/"
        listed = "".join(f"{e.name}: {url}experiments/{e.pk}/\n" for e in demos)
        self.stdout.write(f"login: {DEMO_USER}\npassword: {password}\nurl: {url}\n"
                          f"demo experiment: {url}experiments/{experiment.pk}/\n{listed}{where_data_is()}")
        if setup_only:
            return
        self.serve(host, port)

    def serve(self, host: str, port: int) -> None:
        from daphne.endpoints import build_endpoint_description_strings
        from daphne.server import Server

        from controller.asgi import application
        from controller.celery import app
        from controller.supervision.embedded_worker import EmbeddedWorker

        from controller.supervision.nodes import stamp_quietly
        from controller.supervision.ownership import start_reaper

        from controller.supervision.priority import lower_session

        worker = EmbeddedWorker(app, queues=["runs"]).start()
        restore_priority = lower_session()  # the runs (sessions of their own) come first (controller/supervision/priority.py)
        requeued = recover_runs()
        # no run without an owner, here too (controller/supervision/ownership.py); the worker's node in the registry
        stop_reaper = start_reaper(each_pass=partial(stamp_quietly, ["runs"]))
        self.stdout.write(f"embedded Celery worker started (queue 'runs', {requeued} run(s) re-queued); "
                          "serving, Ctrl-C to stop")
        try:
            Server(application, endpoints=build_endpoint_description_strings(host=host, port=port)).run()
        finally:
            stop_reaper.set()
            # The worker thread dies with this process: stop its run rather than orphan it.
            Run.objects.filter(status__in=[Run.Status.STARTING, Run.Status.RUNNING]).update(cancel_requested=True)
            worker.stop(timeout=settings.THUNDERSYNC_CANCEL_GRACE_S + 30)
            restore_priority()
