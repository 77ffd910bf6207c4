"""Django admin for experiments, schedules, runs and quotas, behind the throttled login."""

from django.contrib import admin

from controller.limits.login_throttle import ThrottledAdminAuthenticationForm
from controller.models import Checkpoint, Experiment, Run, Schedule, Span, StepMetric, UserQuota

admin.site.login_form = ThrottledAdminAuthenticationForm


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "created"]
    list_filter = ["owner"]
    search_fields = ["name", "description"]


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "owner", "knobs"]
    list_filter = ["kind"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "experiment", "schedule", "status", "created", "finished"]
    list_filter = ["status", "schedule__kind"]
    search_fields = ["name", "experiment__name", "celery_task_id"]
    readonly_fields = ["celery_task_id", "pids", "started", "finished"]


@admin.register(StepMetric)
class StepMetricAdmin(admin.ModelAdmin):
    list_display = ["run", "step"]
    list_filter = ["run"]


@admin.register(Span)
class SpanAdmin(admin.ModelAdmin):
    list_display = ["run", "seq", "step", "kind", "lane", "t0", "t1", "traj", "policy_version"]
    list_filter = ["kind"]
    list_select_related = ["run"]
    show_full_result_count = False  # counting millions of spans on every page is slow


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["run", "step", "path", "created"]


@admin.register(UserQuota)
class UserQuotaAdmin(admin.ModelAdmin):
    """Empty limits fall back to THUNDERSYNC_QUOTA_DEFAULTS (controller/limits/quotas.py)."""

    list_display = ["user", "trajectories_per_step", "steps", "concurrent_runs", "queued_runs"]
    search_fields = ["user__username"]
    autocomplete_fields = ["user"]
