"""The route table: pages, the JSON API, exports, login."""

from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic.base import RedirectView

from controller.jsonapi import api
from controller import manage_views
from controller import runs_views
from controller import trajectories
from controller import views
from controller.limits.login_throttle import ThrottledLoginView, admin_login

handler404 = "controller.jsonapi.api_errors.not_found"
handler500 = "controller.limits.outages.server_error"

api_urlpatterns = [
    path("api/openapi.json", api.openapi, name="api-openapi"),
    path("api/experiments/", api.experiments, name="api-experiments"),
    path("api/experiments/<int:experiment_id>/", api.experiment_detail, name="api-experiment"),
    path("api/schedules/", api.schedules, name="api-schedules"),
    path("api/runs/", api.runs, name="api-runs"),
    path("api/runs/<int:run_id>/", api.run_detail, name="api-run"),
    path("api/runs/<int:run_id>/cancel/", api.run_cancel, name="api-run-cancel"),
    path("api/runs/<int:run_id>/resume/", api.run_resume, name="api-run-resume"),
    path("api/runs/<int:run_id>/metrics/", api.run_metrics, name="api-run-metrics"),
    path("api/runs/<int:run_id>/spans/", api.run_spans, name="api-run-spans"),
    path("api/runs/<int:run_id>/advice/", api.run_advice, name="api-run-advice"),
    path("api/runs/<int:run_id>/trajectories/", trajectories.run_trajectories, name="api-run-trajectories"),
    path("api/runs/<int:run_id>/trajectories/<int:traj>/", trajectories.run_trajectory, name="api-run-trajectory"),
    path("api/runs/<int:run_id>/trace.json", api.run_trace, name="api-run-trace"),
    path("api/runs/<int:run_id>/metrics.csv", api.run_metrics_csv, name="api-run-metrics-csv"),
    path("api/compare/", api.compare, name="api-compare"),
    path("api/comparisons/", api.comparisons, name="api-comparisons"),
    path("api/comparisons/<int:comparison_id>/", api.comparison_detail, name="api-comparison"),
]

urlpatterns = [
    path("admin/login/", admin_login),  # before the admin's own: 429 when throttled
    path("admin/", admin.site.urls),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.experiments, name="experiments"),
    path("experiments/<int:experiment_id>/", views.experiment, name="experiment"),
    path("experiments/<int:experiment_id>/launch/", views.launch, name="launch"),
    path("experiments/<int:experiment_id>/compare/", views.compare_schedules, name="compare-schedules"),
    path("comparisons/<int:comparison_id>/", views.comparison, name="comparison"),
    path("experiments/<int:experiment_id>/edit/", manage_views.experiment_edit, name="experiment-edit"),
    path("experiments/<int:experiment_id>/clone/", manage_views.experiment_clone, name="experiment-clone"),
    path("experiments/<int:experiment_id>/delete/", manage_views.experiment_delete, name="experiment-delete"),
    path("schedules/", manage_views.schedules, name="schedules"),
    path("schedules/<int:schedule_id>/edit/", manage_views.schedule_edit, name="schedule-edit"),
    path("schedules/<int:schedule_id>/delete/", manage_views.schedule_delete, name="schedule-delete"),
    # browsers ask for /favicon.ico on pages without a <link rel="icon"> (JSON, admin)
    path("favicon.ico", RedirectView.as_view(url=f"{settings.STATIC_URL}favicon.svg", permanent=True)),
    path("runs/", runs_views.runs_list, name="runs"),
    path("runs/<int:run_id>/", views.run, name="run"),
    path("runs/<int:run_id>/annotate/", runs_views.run_annotate, name="run-annotate"),
    path("runs/<int:run_id>/delete/", runs_views.run_delete, name="run-delete"),
    path("comparisons/<int:comparison_id>/annotate/", runs_views.comparison_annotate, name="comparison-annotate"),
    path("comparisons/<int:comparison_id>/delete/", runs_views.comparison_delete, name="comparison-delete"),
    path("runs/<int:run_id>/cancel/", views.cancel, name="cancel"),
    path("runs/<int:run_id>/log/", views.run_log, name="run-log"),
    path("runs/<int:run_id>/resume/", views.resume, name="resume"),
    path("compare/", views.compare, name="compare"),
    *api_urlpatterns,
]
