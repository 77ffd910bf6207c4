"""Config text and paths from users: alias bombs refused fast, server paths confined."""

import time

import pytest
import yaml

from controller.models import Experiment, Run, Schedule
from tests.learner.test_safe_yaml import alias_bomb

from .conftest import QUICKSTART, ROOT, post_json

pytestmark = pytest.mark.django_db


def timed(call):
    """The call's CPU time on this thread (the server's parsing cost, not others' load),
    after one warm-up call (a process's first request imports and builds the URL conf)."""
    call()
    started = time.thread_time()
    result = call()
    return result, time.thread_time() - started


def test_the_alias_bomb_is_refused_fast_through_the_api(alice_client):
    response, cpu_s = timed(lambda: post_json(alice_client, "/api/experiments/", {"name": "x", "config": alias_bomb()}))
    assert response.status_code == 400
    assert "anchors and aliases" in response.json()["errors"]["config"]
    assert cpu_s < 0.05, cpu_s
    assert not Experiment.objects.exists()


def test_the_alias_bomb_is_refused_fast_through_the_form(alice_client):
    response, cpu_s = timed(lambda: alice_client.post("/", {"name": "x", "config": alias_bomb()}))
    assert response.status_code == 400
    assert "config" in response.context["form"].errors
    assert "anchors and aliases" in response.context["form"].errors["config"][0]
    assert cpu_s < 0.05, cpu_s


def with_model(**model) -> dict:
    return {**QUICKSTART, "model": {**QUICKSTART.get("model", {}), **model}}


@pytest.mark.parametrize("model, field", [
    ({"policy": "/etc"}, "model.policy"),
    ({"policy": "relative/dir"}, "model.policy"),
    ({"teacher": "~/models/x"}, "model.teacher"),
    ({"policy": "/srv/models/../../etc"}, "model.policy"),
    ({"cache_dir": "/tmp/anywhere"}, "model.cache_dir"),
    ({"cache_dir": "../../elsewhere"}, "model.cache_dir"),
    ({"cache_dir": "~/.cache"}, "model.cache_dir"),
])
def test_a_path_outside_the_roots_is_refused_naming_the_field(alice_client, settings, tmp_path, model, field):
    settings.THUNDERSYNC_MODEL_ROOTS = [str(tmp_path)]
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": with_model(**model)})
    assert response.status_code == 400
    assert response.json()["errors"]["config"].startswith(f"{field}: ")
    assert not Experiment.objects.exists()


def test_paths_inside_the_roots_and_the_run_directory_are_accepted(alice_client, settings, tmp_path):
    (tmp_path / "my-model").mkdir()
    settings.THUNDERSYNC_MODEL_ROOTS = [str(tmp_path)]
    config = with_model(policy=str(tmp_path / "my-model"), teacher="builtin:teacher", cache_dir="cache")
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": config})
    assert response.status_code == 201, response.content


def test_a_symlink_out_of_a_root_is_refused(alice_client, settings, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to("/etc")
    settings.THUNDERSYNC_MODEL_ROOTS = [str(root)]
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": with_model(policy=str(root / "escape"))})
    assert response.status_code == 400
    assert "model.policy" in response.json()["errors"]["config"]


def test_schedule_knobs_cannot_reach_server_paths_either(alice_client, alice_experiment, sync_preset):
    response = post_json(alice_client, "/api/schedules/", {"name": "evil", "kind": "sync",
                                                           "knobs": {"model.cache_dir": "/var/tmp/x"}})
    assert response.status_code == 400
    assert "model.cache_dir" in response.json()["errors"]["knobs"]
    # A preset stored before the check (or by an admin) is refused at launch.
    stored = Schedule.objects.create(owner=alice_experiment.owner, name="stored", kind="sync",
                                     knobs={"model.policy": "/etc"})
    response = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": stored.pk})
    assert response.status_code == 400
    assert "model.policy" in response.json()["errors"]["schedule"]
    assert not Run.objects.exists()


def jsonl_math(**task) -> dict:
    config = yaml.safe_load((ROOT / "configs" / "jsonl-math.yaml").read_text())
    return {**config, "task": {**config["task"], **task}}


@pytest.mark.parametrize("task, field", [
    ({"path": "/etc/passwd"}, "task.path"),
    ({"path": "thundersync.sqlite3"}, "task.path"),  # relative paths resolve against the project root
    ({"path": "configs/data/../../controller/settings/base.py"}, "task.path"),
    ({"reward": "os:system"}, "task.reward"),
    ({"reward": "configs/data/reward.py:score"}, "task.reward"),
])
def test_data_sets_and_reward_code_are_confined(alice_client, task, field):
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": jsonl_math(**task)})
    assert response.status_code == 400
    assert response.json()["errors"]["config"].startswith(f"{field}: ")


def test_shipped_data_data_roots_and_allowed_rewards_are_accepted(alice_client, settings, tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    settings.THUNDERSYNC_DATA_ROOTS = [str(tmp_path)]
    settings.THUNDERSYNC_REWARD_FUNCTIONS = ["my_rewards:score"]
    for task in ({}, {"path": str(tmp_path / "mine.jsonl")}, {"reward": "my_rewards:score"}, {"reward": "regex",
                                                                                              "reward_pattern": "(.*)"}):
        response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": jsonl_math(**task)})
        assert response.status_code == 201, (task, response.content)


@pytest.mark.parametrize("config", ["train:\n  steps: " + "9" * 5000, "a: " + "[" * 49_000 + "]" * 49_000,
                                    "a: !!timestamp 99999-01-01"])
def test_any_yaml_loader_error_is_a_400_naming_the_config(alice_client, config):
    response, cpu_s = timed(lambda: post_json(alice_client, "/api/experiments/", {"name": "x", "config": config}))
    assert response.status_code == 400 and "config" in response.json()["errors"], response.content
    assert cpu_s < 0.2, cpu_s
    assert alice_client.post("/", {"name": "x", "config": config}).status_code == 400


def test_a_config_over_the_size_cap_is_refused_unparsed(alice_client, monkeypatch):
    """40 KB of YAML is refused on its length: the parser never sees it (it cost ~0.5 s of CPU
    to build before the cap; docs/results.md)."""
    import learner.safe_yaml as safe_yaml
    from controller.forms import MAX_CONFIG_CHARS

    parsed = []
    monkeypatch.setattr(safe_yaml, "_parse", lambda *args: parsed.append(args))
    text = yaml.safe_dump(QUICKSTART) + "".join(f"# padding {i} {'x' * 60}\n" for i in range(600))
    assert len(text) > MAX_CONFIG_CHARS
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": text})
    assert response.status_code == 400
    assert response.json()["errors"]["config"] == f"longer than {MAX_CONFIG_CHARS} characters"
    assert parsed == [] and not Experiment.objects.exists()


def test_a_config_of_too_many_values_is_refused_naming_the_line(alice_client):
    from controller.forms import MAX_CONFIG_VALUES

    text = yaml.safe_dump(QUICKSTART) + "junk:\n" + "  k: [" + ",".join(["1"] * MAX_CONFIG_VALUES) + "]\n"
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": text})
    assert response.status_code == 400
    assert f"more than {MAX_CONFIG_VALUES} values" in response.json()["errors"]["config"]
    assert response.json()["errors"]["config"].startswith("refused at line ")
    as_json = {**QUICKSTART, "junk": {f"k{i}": [1, 2] for i in range(MAX_CONFIG_VALUES)}}
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": as_json})
    assert response.status_code == 400
    assert response.json()["errors"]["config"] == f"more than {MAX_CONFIG_VALUES} values"
    assert not Experiment.objects.exists()
