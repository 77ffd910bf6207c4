import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from controller.config_merge import apply_overrides, flatten, run_config
from controller.models import Experiment, Schedule, Span

from .conftest import QUICKSTART, make_run

pytestmark = pytest.mark.django_db


def test_it_accepts_the_quickstart_config(alice):
    Experiment(owner=alice, name="ok", config=QUICKSTART).full_clean()


def test_it_names_the_bad_config_field(alice):
    experiment = Experiment(owner=alice, name="bad", config={"train": {"steps": -3}})
    with pytest.raises(ValidationError) as err:
        experiment.full_clean()
    assert "train.steps" in err.value.message_dict["config"][0]


def test_it_rejects_unknown_config_fields(alice):
    with pytest.raises(ValidationError) as err:
        Experiment(owner=alice, name="bad", config={"trian": {}}).full_clean()
    assert "trian: unknown field" in err.value.message_dict["config"][0]


def test_schedule_knobs_default_to_the_train_section():
    schedule = Schedule(name="fa", kind="fully-async", knobs={"max_staleness": 3, "algorithm.clip_ratio": 0.1})
    assert schedule.overrides() == {
        "train.max_staleness": 3, "algorithm.clip_ratio": 0.1, "train.schedule": "fully-async",
    }


def test_it_rejects_knobs_outside_the_config_schema():
    with pytest.raises(ValidationError) as err:
        Schedule(name="x", kind="async", knobs={"max_staleness": -1}).full_clean()
    assert "train.max_staleness" in err.value.message_dict["knobs"][0]
    with pytest.raises(ValidationError) as err:
        Schedule(name="y", kind="async", knobs={"warp_speed": 9}).full_clean()
    assert "train.warp_speed: unknown field" in err.value.message_dict["knobs"][0]


def test_run_config_merges_experiment_schedule_and_steps(alice_experiment, sync_preset):
    config = run_config(alice_experiment.config, sync_preset.overrides(), 5, "my run")
    assert config["train"]["schedule"] == "sync"
    assert config["train"]["steps"] == 5
    assert config["name"] == "my run"
    assert config["train"]["group_size"] == QUICKSTART["train"]["group_size"]
    assert config["rollout"]["top_p"] == 1.0  # defaults are filled in: the diff compares whole configs


def test_apply_overrides_leaves_the_input_alone():
    original = {"train": {"steps": 1}}
    assert apply_overrides(original, {"train.steps": 4, "model.dtype": "float64"}) == {
        "train": {"steps": 4}, "model": {"dtype": "float64"},
    }
    assert original == {"train": {"steps": 1}}


def test_flatten_gives_dotted_paths():
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": []}) == {"a.b": 1, "a.c.d": None, "e": []}


def test_span_seq_is_unique_per_run(alice_run):
    Span.objects.create(run=alice_run, seq=0, step=0, kind="learner.backward", t0=0, t1=1, lane="learner/0")
    with pytest.raises(IntegrityError):
        Span.objects.create(run=alice_run, seq=0, step=0, kind="learner.backward", t0=0, t1=1, lane="learner/0")


def test_global_schedule_names_are_unique(sync_preset):
    with pytest.raises(IntegrityError):
        Schedule.objects.create(owner=None, name="sync", kind="sync")


def test_str_says_what_it_is(alice_experiment, sync_preset, alice):
    run = make_run(alice_experiment, sync_preset)
    assert str(alice_experiment) == "quickstart"
    assert str(Schedule(name="fast", kind="fully-async")) == "fast (fully-async)"
    assert str(run) == f"run {run.pk}"
