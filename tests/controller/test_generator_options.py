"""reasoning-gym generator options through every way into a run (experiment create and update,
schedule knobs, launch overrides, sweeps): an option that opens a file reaches none of the
server's files, each refusal a 400 naming the field; exponential settings are capped; an
evaluation's samples count against the per-step sample quota."""

import pytest

from controller.models import Experiment, Run
from learner import gym_options

from .conftest import QUICKSTART, post_json

pytestmark = pytest.mark.django_db
ESCAPES = ("/etc/machine-id", "../../../../etc/passwd", "~/.ssh/id_rsa")


def gym_task(name: str, options: dict) -> dict:
    return {"name": "reasoning-gym", "size": 100, "datasets": [{"name": name, "config": options}]}


def gym_config(name: str, options: dict) -> dict:
    return {**QUICKSTART, "task": gym_task(name, options)}


FAMILY_CASES = [(name, key, escape) for (name, key) in sorted(gym_options.FILE_OPTIONS) for escape in ESCAPES]


@pytest.fixture
def no_env_roots(monkeypatch):
    monkeypatch.delenv(gym_options.DATA_ROOTS_ENV, raising=False)


@pytest.mark.parametrize("name, key, escape", FAMILY_CASES)
def test_a_file_option_is_refused_on_create_update_and_as_a_knob(alice_client, alice_experiment, no_env_roots,
                                                                 name, key, escape):
    field = f"task.datasets[0].config.{key}: "
    created = post_json(alice_client, "/api/experiments/", {"name": "leak", "config": gym_config(name, {key: escape})})
    assert created.status_code == 400, created.content
    assert created.json()["errors"]["config"].startswith(field)
    assert not Experiment.objects.filter(name="leak").exists()
    edit = alice_client.post(f"/experiments/{alice_experiment.pk}/edit/",
                             {"name": alice_experiment.name, "description": "", "config":
                              f"task: {{name: reasoning-gym, datasets: [{{name: {name}, config: {{{key}: '{escape}'}}}}]}}"})
    assert edit.status_code == 400 and field.rstrip(": ") in edit.content.decode()
    alice_experiment.refresh_from_db()
    assert "datasets" not in alice_experiment.config.get("task", {})
    knob = post_json(alice_client, "/api/schedules/", {"name": f"k-{len(escape)}", "kind": "sync", "knobs": {
        "task.name": "reasoning-gym", "task.datasets": gym_task(name, {key: escape})["datasets"]}})
    assert knob.status_code == 400 and field in knob.json()["errors"]["knobs"], knob.content


@pytest.fixture
def gym_experiment(alice):
    return Experiment.objects.create(owner=alice, name="gym", config=gym_config(
        "spell_backward", {"data_file": "words3to10.txt", "min_word_len": 3, "max_word_len": 10}))


@pytest.mark.parametrize("name, key, escape", FAMILY_CASES)
def test_a_file_option_is_refused_as_a_launch_override_and_in_a_sweep(alice_client, gym_experiment, sync_preset,
                                                                       no_env_roots, name, key, escape):
    field = f"task.datasets[0].config.{key}: "
    bad = gym_task(name, {key: escape})["datasets"]
    launch = post_json(alice_client, "/api/runs/", {"experiment": gym_experiment.pk, "schedule": sync_preset.pk,
                                                    "overrides": {"task.datasets": bad}})
    assert launch.status_code == 400 and launch.json()["errors"]["overrides"].startswith(field), launch.content
    good = gym_experiment.config["task"]["datasets"]
    sweep = post_json(alice_client, "/api/comparisons/", {"experiment": gym_experiment.pk, "schedules": [sync_preset.pk],
                                                          "steps": 3, "sweep": {"field": "task.datasets",
                                                                                "values": [good, bad]}})
    assert sweep.status_code == 400 and sweep.json()["errors"]["sweep_values"].startswith(field), sweep.content
    assert not Run.objects.exists()


def test_a_file_under_a_data_root_is_allowed_and_one_elsewhere_is_not(alice_client, settings, monkeypatch, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "words.txt").write_text("alpha\nbravo\n")
    monkeypatch.setenv(gym_options.DATA_ROOTS_ENV, str(root))  # the trainer's environment
    settings.THUNDERSYNC_DATA_ROOTS = [str(root)]  # the server's setting (read from the same variable)
    config = gym_config("spell_backward", {"data_file": str(root / "words.txt")})
    assert post_json(alice_client, "/api/experiments/", {"name": "ok", "config": config}).status_code == 201
    settings.THUNDERSYNC_DATA_ROOTS = []  # the server allows less than the environment: the server wins
    refused = post_json(alice_client, "/api/experiments/", {"name": "no", "config": config})
    assert refused.status_code == 400
    assert refused.json()["errors"]["config"].startswith("task.datasets[0].config.data_file: ")


def test_unknown_options_and_nested_composites_are_refused(alice_client):
    unknown = post_json(alice_client, "/api/experiments/", {"name": "x", "config": gym_config(
        "spell_backward", {"data_path": "words3to10.txt"})})
    assert unknown.json()["errors"]["config"].startswith("task.datasets[0].config.data_path: not an option")
    nested = post_json(alice_client, "/api/experiments/", {"name": "x", "config": gym_config("composite", {
        "datasets": [{"name": "spell_backward", "config": {"data_file": "/etc/machine-id"}}]})})
    assert nested.json()["errors"]["config"].startswith("task.datasets[0].name: 'composite' nests other datasets")


@pytest.mark.parametrize("disks", [22, 40])
def test_tower_of_hanoi_disks_are_capped_by_cost(alice_client, disks):
    response = post_json(alice_client, "/api/experiments/", {"name": "hanoi", "config": gym_config(
        "tower_of_hanoi", {"min_disks": 3, "max_disks": disks})})
    assert response.status_code == 400
    assert response.json()["errors"]["config"] == (
        f"task.datasets[0].config.max_disks: {disks} is over tower_of_hanoi's limit of 15 (the work to generate "
        "an item grows exponentially with it)")


def eval_train(**values) -> dict:
    return {**QUICKSTART, "train": {**QUICKSTART.get("train", {}), **values}}


def test_an_evaluation_is_bounded_by_the_per_step_sample_quota(alice_client, alice_experiment, sync_preset):
    costly = eval_train(eval_every=1, eval_mode="pass@k", eval_k=256, eval_prompts=100_000)
    response = post_json(alice_client, "/api/experiments/", {"name": "evals", "config": costly})
    assert response.status_code == 400
    assert response.json()["errors"]["config"] == (
        "train.eval_prompts × train.eval_k / train.eval_every = 100000 × 256 / 1 = 25600000 evaluation samples "
        "per step, over your quota of 1024 trajectories per step")
    # amortised: 64 prompts × 32 samples every 2 steps is 1024 a step, within the quota; every step is not
    fits = eval_train(eval_every=2, eval_mode="pass@k", eval_k=32, eval_prompts=64)
    assert post_json(alice_client, "/api/experiments/", {"name": "fits", "config": fits}).status_code == 201
    launch = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": sync_preset.pk,
                                                    "overrides": {"train.eval_every": 1, "train.eval_mode": "pass@k",
                                                                  "train.eval_k": 32, "train.eval_prompts": 64}})
    assert launch.status_code == 400
    assert launch.json()["errors"]["overrides"].startswith(
        "train.eval_prompts × train.eval_k / train.eval_every = 64 × 32 / 1 = 2048 evaluation samples per step")
    assert not Run.objects.exists()
