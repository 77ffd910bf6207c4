"""Per-user quotas: clear errors naming what is over, site defaults, admin overrides."""

import pytest

from controller.models import Experiment, Run, UserQuota

from .conftest import QUICKSTART, make_run, post_json

pytestmark = pytest.mark.django_db


def config_with(**train) -> dict:
    return {**QUICKSTART, "train": {**QUICKSTART.get("train", {}), **train}}


def test_an_experiment_over_the_trajectory_quota_is_refused(alice_client):
    response = post_json(alice_client, "/api/experiments/",
                         {"name": "huge", "config": config_with(prompts_per_step=65536, group_size=1024)})
    assert response.status_code == 400
    assert response.json()["errors"]["config"] == (
        "train.prompts_per_step × train.group_size = 65536 × 1024 = 67108864 trajectories per step, "
        "over your quota of 1024")
    assert not Experiment.objects.exists()


def test_an_experiment_over_the_step_quota_is_refused(alice_client):
    response = post_json(alice_client, "/api/experiments/", {"name": "long", "config": config_with(steps=1_000_000)})
    assert response.status_code == 400
    assert "train.steps = 1000000 is over your quota of 10000 steps" in response.json()["errors"]["config"]


def test_a_launch_over_the_step_quota_names_steps(alice_client, alice_experiment, sync_preset):
    response = post_json(alice_client, "/api/runs/",
                         {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 10_001})
    assert response.status_code == 400
    assert "over your quota of 10000 steps" in response.json()["errors"]["steps"]
    assert not Run.objects.exists()


def test_the_admin_sets_one_users_quota(alice, alice_client, bob_client, alice_experiment, sync_preset, settings):
    UserQuota.objects.create(user=alice, steps=3, trajectories_per_step=16)
    launch = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 4}
    assert "over your quota of 3 steps" in post_json(alice_client, "/api/runs/", launch).json()["errors"]["steps"]
    big = config_with(prompts_per_step=4, group_size=8)
    assert "over your quota of 16" in post_json(alice_client, "/api/experiments/",
                                               {"name": "x", "config": big}).json()["errors"]["config"]
    assert post_json(bob_client, "/api/experiments/", {"name": "x", "config": big}).status_code == 201


def test_a_quota_lowered_later_is_enforced_at_launch(alice, alice_client, alice_experiment, sync_preset):
    UserQuota.objects.create(user=alice, trajectories_per_step=2)
    response = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": sync_preset.pk})
    assert response.status_code == 400
    assert "trajectories per step, over your quota of 2" in response.json()["errors"]["experiment"]


def test_queued_runs_are_capped_per_user(alice, alice_client, bob_client, alice_experiment, bob_experiment,
                                         sync_preset, settings):
    settings.THUNDERSYNC_QUOTA_DEFAULTS = {**settings.THUNDERSYNC_QUOTA_DEFAULTS, "queued_runs": 2}
    launch = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk}
    assert [post_json(alice_client, "/api/runs/", launch).status_code for _ in range(2)] == [201, 201]
    refused = post_json(alice_client, "/api/runs/", launch)
    assert refused.status_code == 429
    assert refused.json()["errors"]["quota"].startswith("you already have 2 queued runs, your quota is 2")
    assert Run.objects.filter(experiment__owner=alice).count() == 2
    # Another user's queue is their own.
    bob_launch = {"experiment": bob_experiment.pk, "schedule": sync_preset.pk}
    assert post_json(bob_client, "/api/runs/", bob_launch).status_code == 201


def test_the_launch_page_shows_quota_errors(alice, alice_client, alice_experiment, sync_preset):
    UserQuota.objects.create(user=alice, queued_runs=1)
    make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED)
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/launch/", {"schedule": sync_preset.pk})
    assert response.status_code == 400
    assert "you already have 1 queued runs" in response.content.decode()
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/launch/",
                                 {"schedule": sync_preset.pk, "steps": 20_000})
    assert "over your quota of 10000 steps" in response.context["launch_form"].errors["steps"][0]


def test_quotas_are_adjustable_in_the_admin(django_user_model, alice):
    from django.test import Client

    django_user_model.objects.create_superuser("root", password="root-password")
    admin = Client()
    admin.force_login(django_user_model.objects.get(username="root"))
    response = admin.post("/admin/controller/userquota/add/", {"user": alice.pk, "concurrent_runs": 5})
    assert response.status_code == 302, response.content[:500]
    assert UserQuota.objects.get(user=alice).concurrent_runs == 5


@pytest.mark.parametrize("section, name, value", [("rollout", "workers", 64), ("learner", "world_size", 62),
                                                  ("task", "size", 10_000_000)])
def test_processes_and_items_per_run_are_bounded_by_the_quota(alice, alice_client, section, name, value):
    config = {**QUICKSTART, section: {**QUICKSTART.get(section, {}), name: value}}
    response = post_json(alice_client, "/api/experiments/", {"name": "big", "config": config})
    assert response.status_code == 400
    assert response.json()["errors"]["config"].startswith(f"{section}.{name} = {value} is over your quota of ")
    UserQuota.objects.create(user=alice, rollout_workers=64, learner_world_size=62, task_size=10_000_000, processes=128)
    assert post_json(alice_client, "/api/experiments/", {"name": "big", "config": config}).status_code == 201


def test_the_schema_shows_the_users_bounds(alice, alice_client):
    UserQuota.objects.create(user=alice, rollout_workers=3)
    config = alice_client.get("/api/openapi.json").json()["components"]["schemas"]["ExperimentInput"]["properties"][
        "config"]["oneOf"][0]["properties"]
    assert config["rollout"]["properties"]["workers"]["maximum"] == 3
    assert config["learner"]["properties"]["world_size"]["maximum"] == 4
    assert config["task"]["properties"]["size"]["maximum"] == 100_000


def refusal(client, config: dict) -> str:
    """The one-line 400 of saving an experiment with ``config``; nothing is stored."""
    response = post_json(client, "/api/experiments/", {"name": "costly", "config": config})
    assert response.status_code == 400, response.content
    assert not Experiment.objects.filter(name="costly").exists()
    message = response.json()["errors"]["config"]
    assert "\n" not in message
    return message


def with_section(section: str, **values) -> dict:
    return {**QUICKSTART, section: {**QUICKSTART.get(section, {}), **values}}


def test_vllm_replicas_are_bounded_like_workers(alice_client):
    message = refusal(alice_client, with_section("rollout", engine="vllm", replicas=9))
    assert message == "rollout.replicas = 9 is over your quota of 8"


def test_rollout_processes_and_learner_ranks_count_against_one_process_quota(alice, alice_client):
    UserQuota.objects.create(user=alice, processes=4)
    config = {**with_section("rollout", workers=3), "learner": {"world_size": 2}}
    assert refusal(alice_client, config) == (
        "rollout.workers + learner.world_size = 3 + 2 = 5 processes, over your quota of 4 processes per run")
    config["rollout"]["workers"] = 2
    assert post_json(alice_client, "/api/experiments/", {"name": "fits", "config": config}).status_code == 201


def test_tokens_per_step_count_the_prompt_and_every_turn(alice, alice_client):
    UserQuota.objects.create(user=alice, tokens_per_step=10_000)
    config = {**with_section("rollout", max_new_tokens=100),
              "task": {**QUICKSTART["task"], "max_turns": 4, "prompt_preamble": "p" * 200}}
    assert post_json(alice_client, "/api/experiments/", {"name": "fits", "config": config}).status_code == 201  # 9600
    message = refusal(alice_client, {**config, "train": {**QUICKSTART["train"], "group_size": 8}})
    assert message == ("train.prompts_per_step × train.group_size × (prompt + rollout.max_new_tokens × task.max_turns)"
                       " = 4 × 8 × (200 + 100 × 4) = 19200 tokens per step, over your quota of 10000 tokens per step")


@pytest.mark.parametrize("value", [2000, 100_000])
def test_a_reasoning_gym_generator_setting_is_bounded(alice_client, value):
    task = {"name": "reasoning-gym", "size": 100, "datasets": [
        {"name": "basic_arithmetic", "config": {"min_terms": 2, "max_terms": value, "seed": 10**9}}]}
    assert refusal(alice_client, {**QUICKSTART, "task": task}) == (
        f"task.datasets[0].config.max_terms = {value} is over your quota of 100 for a task generator's setting "
        "(terms, digits, sizes of what it generates)")


def test_a_datasets_own_size_is_bounded_by_the_task_size_quota_not_as_a_setting(alice_client):
    task = {"name": "reasoning-gym", "size": 100, "datasets": [
        {"name": "basic_arithmetic", "config": {"size": 200_000, "max_terms": 3}}]}
    assert refusal(alice_client, {**QUICKSTART, "task": task}) == (
        "task.datasets[0].config.size = 200000 is over your quota of 100000 (task_size)")


def test_checkpoints_kept_are_bounded(alice_client):
    assert refusal(alice_client, with_section("train", keep_checkpoints=1000)) == (
        "train.keep_checkpoints = 1000 is over your quota of 10")


def test_an_unknown_builtin_model_is_refused_when_saved(alice_client):
    assert refusal(alice_client, with_section("model", policy="builtin:huge")) == (
        "model.policy: 'builtin:huge' is not a built-in model (builtin:tiny, builtin:teacher, builtin:tiny-long) "
        "nor a directory")


def test_a_launch_whose_override_is_over_a_cost_quota_names_the_overrides(alice_client, alice_experiment, sync_preset):
    response = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": sync_preset.pk,
                                                      "overrides": {"rollout.max_new_tokens": 4096,
                                                                    "task.max_turns": 16, "train.group_size": 128}})
    assert response.status_code == 400
    assert "tokens per step, over your quota of 4194304" in response.json()["errors"]["overrides"]
    assert not Run.objects.exists()


def test_a_sweep_that_does_not_fit_the_queue_counts_what_was_queued_before_it(alice, alice_client, alice_experiment,
                                                                              sync_preset):
    UserQuota.objects.create(user=alice, queued_runs=10)
    for _ in range(8):
        make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED)
    response = post_json(alice_client, "/api/comparisons/", {
        "experiment": alice_experiment.pk, "schedules": [sync_preset.pk], "steps": 3,
        "sweep": {"field": "train.lr", "values": [1e-4, 2e-4, 3e-4, 4e-4]}})
    assert response.status_code == 429
    assert response.json()["errors"]["quota"].startswith(
        "you already have 8 queued runs and this launch adds 4, your quota is 10")
    assert Run.objects.filter(status=Run.Status.QUEUED).count() == 8


@pytest.mark.parametrize("config, gpus", [
    ({}, 0),  # model.device cpu
    ({"model": {"device": "cuda"}, "learner": {"world_size": 2}}, 2),  # one per rank
    ({"model": {"device": "cuda"}, "learner": {"world_size": 2}, "rollout": {"workers": 4},
      "placement": {"learner": [0, 1], "rollout": [2, 3], "workers_per_gpu": 2}}, 4),
    ({"model": {"device": "cuda"}, "learner": {"world_size": 4}, "rollout": {"workers": 2},
      "placement": {"learner": [0, 1], "rollout": [2, 3], "gpus_per_node": 4}, "cluster": {"nodes": 2}}, 8),
])
def test_a_runs_gpus_are_what_its_placement_names_on_each_node(config, gpus):
    from learner.config import RunConfig

    from controller.limits import run_cost

    full = RunConfig.model_validate(config).model_dump()
    assert run_cost.gpus(full).value == gpus


def test_a_run_over_the_gpu_quota_is_refused_naming_placement(alice):
    from learner.config import RunConfig

    from controller.limits.quotas import QuotaExceeded, check_config

    UserQuota.objects.create(user=alice, gpus=4, learner_world_size=8)
    config = RunConfig.model_validate({
        "model": {"device": "cuda"}, "learner": {"world_size": 4}, "rollout": {"workers": 2},
        "placement": {"learner": [0, 1], "rollout": [2, 3], "gpus_per_node": 4}, "cluster": {"nodes": 2}}).model_dump()
    with pytest.raises(QuotaExceeded) as err:
        check_config(alice, config)
    assert err.value.field == "placement.learner"
    assert err.value.message == ("the GPUs placement names on a node × 2 nodes = 4 × 2 nodes = 8 GPUs, "
                                 "over your quota of 4 GPUs per run")
