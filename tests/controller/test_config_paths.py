"""Every config field that names a path, tried with every kind of escape (absolute, ``..``,
``~``, a symlink), through the API's experiment, its schedule knobs and at run start: each is
refused naming the field. A new string field of RunConfig fails the first test until it is
classified (controller/server_paths.py)."""

import copy
import os
import typing

import pytest
import yaml
from pydantic import BaseModel

from controller import server_paths
from controller.models import Run
from controller.supervision.runlog import run_dir
from controller.supervision.supervisor import supervise
from learner.config import RunConfig

from .conftest import ROOT, post_json

pytestmark = pytest.mark.django_db
JSONL_MATH = yaml.safe_load((ROOT / "configs" / "jsonl-math.yaml").read_text())


def string_fields(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, str, object]]:
    """(dotted name, field name, field) of every field of ``model`` that holds text."""
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        inner = [a for arg in args for a in (typing.get_args(arg) or (arg,))]
        if nested:
            yield from string_fields(nested[0], f"{prefix}{name}.")
        elif str in args or str in inner or any(typing.get_origin(a) is typing.Annotated for a in inner):
            yield f"{prefix}{name}", name, field


PATH_FIELDS = {dotted: kind for dotted, name, field in string_fields(RunConfig)
               if (kind := server_paths.path_kind(dotted, name, field)) is not None}


def test_every_text_field_is_a_classified_path_or_named_as_no_path():
    unclassified = [d for d, n, f in string_fields(RunConfig)
                    if d not in PATH_FIELDS and d not in server_paths.NOT_PATHS and d not in server_paths.GENERATOR_FIELDS]
    assert unclassified == []
    assert PATH_FIELDS == {"model.policy": "model", "model.teacher": "model", "model.cache_dir": "run",
                           "task.path": "data", "task.reward": "code", "train.output_dir": "run",
                           "tracking.tensorboard": "run"}


def with_field(dotted: str, value: str) -> dict:
    config = copy.deepcopy(JSONL_MATH)
    *parents, leaf = dotted.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return config


@pytest.fixture
def roots(settings, tmp_path):
    """A model root and a data root, each holding a symlink out of it."""
    model_root, data_root = tmp_path / "models", tmp_path / "data"
    for root in (model_root, data_root):
        root.mkdir()
    (model_root / "escape").symlink_to("/etc")
    (data_root / "escape.jsonl").symlink_to("/etc/passwd")
    settings.THUNDERSYNC_MODEL_ROOTS, settings.THUNDERSYNC_DATA_ROOTS = [str(model_root)], [str(data_root)]
    return {"model": model_root, "data": data_root}


def escapes(kind: str, roots) -> dict[str, str]:
    """escape kind -> a value of a field of ``kind`` that tries it (symlinks of "run" fields
    are planted in the run directory at start: test_a_symlink_in_the_run_directory...)."""
    if kind == "model":
        return {"absolute": "/etc", "dotdot": f"{roots['model']}/../../etc", "home": "~/models/x",
                "symlink": str(roots["model"] / "escape")}
    if kind == "data":
        return {"absolute": "/etc/passwd", "dotdot": "configs/data/../../controller/settings/base.py",
                "home": "~/data.jsonl", "symlink": str(roots["data"] / "escape.jsonl")}
    if kind == "code":
        return {"absolute": "/tmp/reward.py:score", "dotdot": "../reward.py:score", "home": "~/reward.py:score",
                "symlink": "configs/data/link.py:score"}
    return {"absolute": "/tmp/elsewhere", "dotdot": "../run-1/learner.stderr.log", "home": "~/.cache"}


CASES = [(field, escape) for field, kind in sorted(PATH_FIELDS.items())
         for escape in ("absolute", "dotdot", "home", "symlink") if not (kind == "run" and escape == "symlink")]


@pytest.mark.parametrize("field, escape", CASES)
def test_every_escape_of_every_path_field_is_refused_naming_it(alice_client, roots, field, escape):
    value = escapes(PATH_FIELDS[field], roots)[escape]
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": with_field(field, value)})
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["config"].startswith(f"{field}: ")
    knob = post_json(alice_client, "/api/schedules/", {"name": f"k-{escape}", "kind": "sync", "knobs": {field: value}})
    assert knob.status_code == 400 and field in knob.json()["errors"]["knobs"], knob.content


@pytest.mark.parametrize("field", sorted(f for f, kind in PATH_FIELDS.items() if kind == "run"))
def test_a_symlink_in_the_run_directory_cannot_lead_a_written_path_out(tmp_path, field):
    run_dir = tmp_path / "run-7"
    run_dir.mkdir()
    (run_dir / "planted").symlink_to(tmp_path)  # e.g. left by an earlier attempt's output
    config = with_field(field, "planted/x")
    assert server_paths.run_dir_escape(config, run_dir).startswith(f"{field}: 'planted/x' leads outside")
    assert server_paths.run_dir_escape(with_field(field, "inside/x"), run_dir) is None
    os.symlink(run_dir / "inside", run_dir / "loop")  # a link that stays inside is fine
    assert server_paths.run_dir_escape(with_field(field, "loop/x"), run_dir) is None


def test_relative_paths_inside_the_run_directory_are_accepted(alice_client):
    config = with_field("tracking.tensorboard", "tb")
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": config})
    assert response.status_code == 201, response.content


def test_a_run_whose_written_path_leads_out_fails_at_start_naming_it(alice_experiment, sync_preset, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = str(tmp_path / "runs")
    run = Run.objects.create(experiment=alice_experiment, schedule=sync_preset, steps=1, status=Run.Status.STARTING,
                             config=with_field("tracking.tensorboard", "planted/tb"))
    run_dir(run.pk).mkdir(parents=True)
    (run_dir(run.pk) / "planted").symlink_to(tmp_path / "runs")
    ended = supervise(Run.objects.select_related("experiment", "schedule").get(pk=run.pk))
    assert ended.status == Run.Status.FAILED and ended.error.startswith("tracking.tensorboard: 'planted/tb' leads outside")
    assert not ended.pids  # no learner was started


def test_vllm_speculation_on_a_model_too_large_to_verify_is_refused_when_the_experiment_is_saved(alice_client, roots):
    model = roots["model"] / "big-vocab"
    model.mkdir()
    (model / "config.json").write_text('{"vocab_size": 32000}')
    (model / "model.safetensors").write_bytes(b"")
    config = {"model": {"policy": str(model)}, "rollout": {"engine": "vllm", "speculation": {"enabled": True}}}
    response = post_json(alice_client, "/api/experiments/", {"name": "x", "config": config})
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["config"].startswith("rollout.speculation: the vllm engine verifies drafts")
    config["rollout"]["engine"] = "torch"  # the torch engine verifies any vocabulary
    assert post_json(alice_client, "/api/experiments/", {"name": "y", "config": config}).status_code == 201
