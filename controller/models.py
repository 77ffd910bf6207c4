"""Experiments, schedule presets, runs and what runs report (metrics, spans, checkpoints).

An experiment is a learner config; a run is that config trained under one schedule. The
database is the source of truth for a run's timeline: spans are bulk-inserted, idempotent
on (run, seq), and websocket clients replay from it.
"""

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from learner.config import SCHEDULES, ConfigError, RunConfig, parse_config
from learner.safe_yaml import load_yaml

from controller.config_merge import apply_overrides
from controller.server_paths import check_server_paths


class Experiment(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, max_length=10_000)
    # The config as the user wrote it (a RunConfig mapping); validated by learner.config.
    config = models.JSONField(default=dict, blank=True)
    # The YAML text exactly as written (comments, order), shown and edited on the pages;
    # `config` is what it parses to. Empty for an experiment created from a JSON object.
    config_text = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        return self.name

    def config_yaml(self) -> str:
        """The config as its author wrote it; as YAML when it came as a JSON object or was
        changed elsewhere (the admin edits ``config``) so that the text no longer says it."""
        if self.config_text:
            try:
                if (load_yaml(self.config_text, len(self.config_text)) or {}) == self.config:
                    return self.config_text
            except ValueError:  # UnsafeYamlError, yaml.YAMLError: show what is stored instead
                pass
        return yaml.safe_dump(self.config, sort_keys=False)

    def clean(self):
        try:
            self.run_config()
        except ConfigError as err:
            raise ValidationError({"config": str(err)}) from None

    def run_config(self) -> RunConfig:
        return parse_config(self.config)


class ScheduleQuerySet(models.QuerySet):
    def visible_to(self, user):
        """Global presets (no owner) and the user's own presets."""
        return self.filter(Q(owner__isnull=True) | Q(owner=user))


class Schedule(models.Model):
    KIND_CHOICES = [(kind, kind) for kind in SCHEDULES]

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="schedules",
        help_text="empty for a global preset every user sees",
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=KIND_CHOICES)
    # Extra config values, e.g. {"max_staleness": 2}; a bare key means train.<key>, a dotted
    # key ("algorithm.clip_ratio") names the config field directly.
    knobs = models.JSONField(default=dict, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="unique_schedule_name_per_owner"),
            models.UniqueConstraint(
                fields=["name"], condition=Q(owner__isnull=True), name="unique_global_schedule_name"
            ),
        ]

    def __str__(self):
        return self.name if self.kind == self.name else f"{self.name} ({self.kind})"

    def clean(self):
        if not isinstance(self.knobs, dict):
            raise ValidationError({"knobs": "expected a JSON object of config values"})
        try:
            check_server_paths(parse_config(apply_overrides({}, self.overrides())))
        except (ConfigError, ValueError) as err:
            raise ValidationError({"knobs": str(err)}) from None

    def overrides(self) -> dict:
        """Dotted config paths this preset sets, the schedule kind included."""
        knobs = {(key if "." in key else f"train.{key}"): value for key, value in self.knobs.items()}
        return {**knobs, "train.schedule": self.kind}


TAGS_HELP = "stored as ,tag,tag, so that one tag is found by a substring on every database"


def split_tags(stored: str) -> list[str]:
    return [t for t in stored.split(",") if t]


def join_tags(tags: list[str]) -> str:
    return f",{','.join(tags)}," if tags else ""


class Comparison(models.Model):
    """Runs launched together to compare schedules: the experiment's config and one step count,
    one run per schedule preset and round; the runs of a round share a seed, round k trains the
    launch's seed + k (controller/supervision/launching.py, launch_comparison)."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="comparisons")
    name = models.CharField(max_length=200, blank=True)
    steps = models.PositiveIntegerField()
    note = models.TextField(blank=True, max_length=10_000)
    tags = models.CharField(max_length=500, blank=True, help_text=TAGS_HELP)
    created = models.DateTimeField(auto_now_add=True)
    # a sweep: one config field over a few values, one run per value and schedule
    sweep_field = models.CharField(max_length=200, blank=True)
    sweep_values = models.JSONField(default=list, blank=True)
    # runs per schedule (and sweep value), launched in alternating rounds and run one at a time
    # (controller/supervision/dispatch.py), so the machine's drift spreads over every schedule; the summary pools them
    repeats = models.PositiveSmallIntegerField(default=1)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        return self.name or f"comparison {self.pk}"

    def tag_list(self) -> list[str]:
        return split_tags(self.tags)

    def round_seeds(self) -> list[int]:
        """The seeds its rounds trained, in order (one when the runs share the config's seed)."""
        return sorted({run.overrides["seed"] for run in self.runs.all()
                       if isinstance(run.overrides, dict) and isinstance(run.overrides.get("seed"), int)})


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        STARTING = "starting"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    FINISHED = (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)
    ACTIVE = (Status.STARTING, Status.RUNNING)
    RESUMABLE = (Status.FAILED, Status.CANCELLED)  # with a checkpoint: Resume continues them

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    schedule = models.ForeignKey(Schedule, on_delete=models.PROTECT, related_name="runs")
    name = models.CharField(max_length=200, blank=True)
    steps = models.PositiveIntegerField()
    # The full merged config the learner was given (experiment + schedule + overrides + steps).
    config = models.JSONField(default=dict)
    # dotted config fields set at launch beyond the schedule ({"train.lr": 0.0003}; a sweep's value too)
    overrides = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED, db_index=True)
    celery_task_id = models.CharField(max_length=64, blank=True)
    created = models.DateTimeField(auto_now_add=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True)
    cancel_requested = models.BooleanField(default=False)
    pids = models.JSONField(default=list, blank=True)  # the learner's pid; it leads its process group
    # Ownership (docs/controller.md "No run without an owner"): the supervising process
    # ("host:pid") stamps ``heartbeat`` while it runs; the reaper ends or resumes a run
    # whose stamp went stale, and re-sends a queued run's message the broker lost.
    supervisor = models.CharField(max_length=200, blank=True)
    heartbeat = models.DateTimeField(null=True, blank=True)
    enqueued = models.DateTimeField(null=True, blank=True)  # when its task message was last sent
    attempt = models.PositiveIntegerField(default=0)  # resumes from a checkpoint so far (controller/supervision/resuming.py)
    # the Celery task (message) whose delivery claimed the run: with fair dispatch a message
    # may start another user's run, so a redelivery adopts exactly this run (controller/tasks.py)
    start_task_id = models.CharField(max_length=64, blank=True, db_index=True)
    # launched as one of a comparison's runs (same config, seed and steps; its own schedule)
    comparison = models.ForeignKey(Comparison, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs")
    note = models.TextField(blank=True, max_length=10_000)
    tags = models.CharField(max_length=500, blank=True, help_text=TAGS_HELP)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self):
        return self.name or f"run {self.pk}"

    def round_seed(self) -> int | None:
        """The seed its comparison's round gave it (controller/supervision/launching.py, round_seeds), or None
        when the seed is the config's own, an override of one run or a sweep's value."""
        c = self.comparison
        seed = self.overrides.get("seed") if isinstance(self.overrides, dict) else None
        if c is None or c.repeats <= 1 or c.sweep_field == "seed" or not isinstance(seed, int):
            return None
        return seed

    def launch_overrides(self) -> dict:
        """The overrides that set this run apart from its comparison's others of one schedule
        (a sweep's value, the launch's own), without its round's seed: repeats across seeds pool."""
        overrides = dict(self.overrides) if isinstance(self.overrides, dict) else {}
        if self.round_seed() is not None:
            overrides.pop("seed", None)
        return overrides

    def tag_list(self) -> list[str]:
        return split_tags(self.tags)


class StepMetric(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metrics")
    step = models.IntegerField()
    values = models.JSONField(default=dict)

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="unique_metric_step")]

    def __str__(self):
        return f"{self.run} step {self.step}"


class SystemSample(models.Model):
    """The run's processes every ``tracking.system_every_s`` seconds on one node: CPU %, RSS (and
    GPU) under their ``system/<process>/<quantity>`` names (docs/spans.md, "System samples")."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="system_samples")
    t = models.FloatField()  # the run clock, as the spans'
    node = models.CharField(max_length=200)
    values = models.JSONField(default=dict)

    class Meta:
        ordering = ["t"]
        indexes = [models.Index(fields=["run", "t"], name="system_sample_run_t")]

    def __str__(self):
        return f"{self.run} system at {self.t:.1f} s on {self.node}"


class Span(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="spans")
    seq = models.IntegerField()
    step = models.IntegerField()
    kind = models.CharField(max_length=64)
    t0 = models.FloatField()
    t1 = models.FloatField()
    lane = models.CharField(max_length=64)
    traj = models.IntegerField(null=True, blank=True)
    group = models.IntegerField(null=True, blank=True)
    turn = models.IntegerField(null=True, blank=True)
    policy_version = models.IntegerField(null=True, blank=True)
    tokens = models.IntegerField(default=0)

    class Meta:
        ordering = ["seq"]
        # The unique constraint is also the (run, seq) index that replay reads walk.
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="unique_span_seq")]
        indexes = [models.Index(fields=["run", "step"], name="span_run_step")]

    def __str__(self):
        return f"{self.kind} #{self.seq}"


class Checkpoint(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.IntegerField()
    path = models.CharField(max_length=500)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step"]
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="unique_checkpoint_step")]

    def __str__(self):
        return f"{self.run} checkpoint @ step {self.step}"


class UserQuota(models.Model):
    """Per-user limits (controller/limits/quotas.py); an empty field means the site default from
    ``THUNDERSYNC_QUOTA_DEFAULTS``. Adjusted in the admin."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="quota")
    trajectories_per_step = models.PositiveIntegerField(
        null=True, blank=True, help_text="train.prompts_per_step × train.group_size")
    steps = models.PositiveIntegerField(null=True, blank=True, help_text="train.steps of one run")
    concurrent_runs = models.PositiveIntegerField(
        null=True, blank=True, help_text="runs training at once; more wait in the queue")
    queued_runs = models.PositiveIntegerField(null=True, blank=True, help_text="runs waiting to start")
    rollout_workers = models.PositiveIntegerField(null=True, blank=True, help_text="rollout.workers of one run")
    learner_world_size = models.PositiveIntegerField(null=True, blank=True, help_text="learner.world_size of one run")
    task_size = models.PositiveIntegerField(null=True, blank=True, help_text="task.size of one run")
    processes = models.PositiveIntegerField(
        null=True, blank=True, help_text="rollout processes (workers or replicas, per node) + learner ranks of one run")
    tokens_per_step = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="trajectories × (prompt + max_new_tokens × max_turns) of one step")
    generator_setting = models.PositiveIntegerField(
        null=True, blank=True, help_text="any number in a reasoning-gym dataset's options")
    keep_checkpoints = models.PositiveIntegerField(null=True, blank=True, help_text="train.keep_checkpoints of one run")
    disk_mb = models.PositiveIntegerField(null=True, blank=True, help_text="MB all of the user's run directories hold")
    gpus = models.PositiveIntegerField(
        null=True, blank=True, help_text="GPUs of one run: the GPUs its placement names on each node, or one per learner rank")

    def __str__(self):
        return f"quota of {self.user}"


class RunNode(models.Model):
    """A learner rank of a run that spans nodes, on a node other than rank 0's
    (docs/distributed-nodes.md): the task on queue ``runs.<node>`` that runs it stamps ``heartbeat``
    while its rank runs, and records how it ended. Rank 0's supervisor fails the run when a
    node's task failed or stopped stamping."""

    class Status(models.TextChoices):
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="nodes")
    rank = models.PositiveIntegerField()
    node = models.CharField(max_length=32)
    supervisor = models.CharField(max_length=200, blank=True)  # "host:pid:start" of the node's task
    heartbeat = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["rank"]
        constraints = [models.UniqueConstraint(fields=["run", "rank"], name="unique_run_node_rank")]

    def __str__(self):
        return f"{self.run} rank {self.rank} on {self.node}"


class WorkerNode(models.Model):
    """A node that a live Celery worker serves (controller/supervision/nodes.py, the node registry): each
    worker stamps its own node (THUNDERSYNC_NODE) and every ``runs.<node>`` queue it consumes at
    start and on every reaper pass. A launch whose ``learner.nodes`` names a node not stamped
    within THUNDERSYNC_NODE_TTL_S is refused before anything is sent."""

    name = models.CharField(max_length=32, unique=True)
    seen = models.DateTimeField()
    worker = models.CharField(max_length=200, blank=True)  # "host:pid:start" of the worker that stamped last

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"node {self.name}"


class TrajectoryRecord(models.Model):
    """One trajectory as the learner recorded it after its step (learner/driver/trajectory_records.py):
    its reward, advantage and decoded text (bounded; cuts marked in the text)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="trajectories")
    step = models.IntegerField()
    traj = models.IntegerField()
    group = models.IntegerField()
    reward = models.FloatField()
    advantage = models.FloatField(null=True, blank=True)  # GRPO's A_i; null for OPD
    zero_gradient = models.BooleanField(default=False)  # A = 0 and no KL/entropy term: nothing to learn
    turns = models.IntegerField(default=0)
    tokens = models.IntegerField(default=0)  # generated (scored) tokens
    drafted = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    versions = models.JSONField(default=list)  # policy version per turn
    segments = models.JSONField(default=list)  # [{"role": prompt|turn|observation, "text", ...}]

    class Meta:
        ordering = ["step", "traj"]
        constraints = [models.UniqueConstraint(fields=["run", "traj"], name="unique_trajectory_record")]
        indexes = [models.Index(fields=["run", "step"], name="trajectory_run_step")]

    def __str__(self):
        return f"{self.run} trajectory {self.traj}"
