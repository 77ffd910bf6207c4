"""reasoning-gym generator options (learner/gym_options.py, gym_probe.py): no option
reaches a file outside reasoning_gym's data or the data roots, every text option of every
registered generator is classified (a new one fails here), exponential settings are capped,
and a generator that fails or costs too much is one line before any worker starts."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time

import pytest
import yaml

from learner.config import ConfigError, TaskConfig, load_config
from learner import gym_options
from learner.tasks import gym_probe

CLI = [sys.executable, "-m", "learner.cli"]


def registered() -> dict:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def text_options() -> set[tuple[str, str]]:
    """(generator, option) of every option of every registered generator that can hold a string."""
    return {(name, key) for name in registered() for key, hint in gym_options.options(name).items()
            if gym_options.holds_text(hint)}


def test_every_text_option_of_every_generator_is_classified():
    unclassified = {o for o in text_options() - set(gym_options.FILE_OPTIONS) - gym_options.TEXT_OPTIONS
                    if o[0] not in gym_options.NESTED}
    assert unclassified == set(), "classify these in learner/gym_options.py (FILE_OPTIONS or TEXT_OPTIONS)"
    assert set(gym_options.FILE_OPTIONS) <= text_options()  # still options of the installed reasoning_gym
    assert gym_options.TEXT_OPTIONS <= text_options()
    assert ("spell_backward", "data_file") in gym_options.FILE_OPTIONS


def file_option_cases() -> list[tuple[str, str, str]]:
    """(generator, option, escape) for every option that opens a file, with each way out."""
    escapes = ("/etc/machine-id", "../../../../etc/passwd", "~/.ssh/id_rsa", "words3to10.txt/../../../x")
    return [(name, key, escape) for (name, key) in sorted(gym_options.FILE_OPTIONS) for escape in escapes]


def gym_config(name: str, options: dict) -> dict:
    return {"task": {"name": "reasoning-gym", "size": 100, "datasets": [{"name": name, "config": options}]}}


@pytest.mark.parametrize("name, key, escape", file_option_cases())
def test_a_file_option_outside_the_data_is_refused_when_the_config_loads(tmp_path, monkeypatch, name, key, escape):
    monkeypatch.delenv(gym_options.DATA_ROOTS_ENV, raising=False)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(gym_config(name, {key: escape})))
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"task.datasets[0].config.{key}: {escape!r} is ")
    assert time.perf_counter() - started < 1.0  # refused on the text, before reasoning_gym is imported


def test_the_refusal_is_the_same_whether_the_file_exists_or_not(monkeypatch):
    monkeypatch.delenv(gym_options.DATA_ROOTS_ENV, raising=False)
    messages = []
    for path in ("/etc/passwd", "/etc/no-such-file-here"):
        with pytest.raises(ConfigError) as err:
            load_config_dict(gym_config("spell_backward", {"data_file": path}))
        messages.append(str(err.value).replace(path, "PATH"))
    assert messages[0] == messages[1]


def load_config_dict(data: dict):
    from learner.config import parse_config

    return parse_config(data)


def test_shipped_data_and_files_under_a_data_root_are_allowed(tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    (root / "words.txt").write_text("alpha\nbravo\ncharlie\n")
    (root / "escape.txt").symlink_to("/etc/hostname")
    monkeypatch.setenv(gym_options.DATA_ROOTS_ENV, str(root))
    assert load_config_dict(gym_config("spell_backward", {"data_file": "words3to10.txt"}))
    assert load_config_dict(gym_config("spell_backward", {"data_file": str(root / "words.txt")}))
    with pytest.raises(ConfigError, match=r"^task.datasets\[0\].config.data_file: "):
        load_config_dict(gym_config("spell_backward", {"data_file": str(root / "escape.txt")}))  # a symlink out


@pytest.mark.parametrize("options, message", [
    ({"operators": ["+"], "no_such_option": 1}, "task.datasets[0].config.no_such_option: not an option of basic_arithmetic"),
    ({"max_terms": "/etc/passwd"}, "task.datasets[0].config.max_terms: input should be a valid integer"),
    ({"operators": ["+", "__import__('os')"]}, "task.datasets[0].config: basic_arithmetic refuses these options: "
                                               "unsupported operator: __import__('os')"),
    ({"min_terms": 5, "max_terms": 2}, "task.datasets[0].config: basic_arithmetic refuses these options: "
                                       "max_terms must be >= min_terms"),
])
def test_options_are_the_generators_own_with_their_types(options, message):
    with pytest.raises(ConfigError) as err:
        load_config_dict(gym_config("basic_arithmetic", options))
    assert str(err.value).startswith(message)


def test_a_nested_composite_and_an_unknown_generator_are_refused():
    with pytest.raises(ConfigError, match=r"task.datasets\[0\].name: 'composite' nests other datasets"):
        load_config_dict(gym_config("composite", {"datasets": [
            {"name": "spell_backward", "config": {"data_file": "words3to10.txt"}}]}))
    with pytest.raises(ConfigError, match=r"task.datasets\[0\].name: unknown reasoning-gym dataset 'nope'"):
        load_config_dict(gym_config("nope", {}))


def test_an_unclassified_text_option_is_refused(monkeypatch):
    monkeypatch.setattr(gym_options, "TEXT_OPTIONS", gym_options.TEXT_OPTIONS - {("caesar_cipher", "delimiter")})
    with pytest.raises(ConfigError, match=r"task.datasets\[0\].config.delimiter: a text option of caesar_cipher"):
        load_config_dict(gym_config("caesar_cipher", {"delimiter": "/etc/passwd"}))


@pytest.mark.parametrize("disks", [22, 40])
def test_tower_of_hanoi_disks_are_capped(disks):
    started = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        load_config_dict(gym_config("tower_of_hanoi", {"min_disks": 3, "max_disks": disks}))
    assert str(err.value) == (f"task.datasets[0].config.max_disks: {disks} is over tower_of_hanoi's limit of 15 "
                              "(the work to generate an item grows exponentially with it)")
    assert time.perf_counter() - started < 1.0  # checked before reasoning_gym is imported; nothing is generated


def probe_task(name: str, options: dict) -> TaskConfig:
    return TaskConfig.model_construct(name="reasoning-gym", datasets=[
        type("Spec", (), {"name": name, "config": options})()])


def test_the_probe_stops_a_generator_over_its_time_in_one_line():
    registered()  # reasoning_gym imported (seconds), as a run's preflight has it by then
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:  # 15 disks: 32767 moves an item, 0.1 s; the limit here 10 ms
        gym_probe.probe_generators(probe_task("tower_of_hanoi", {"min_disks": 15, "max_disks": 15}), 0, seconds=0.01)
    assert str(err.value) == ("task.datasets[0].config: tower_of_hanoi did not generate 2 items within 0.01s "
                              "(min_disks=15, max_disks=15): an item costs too much work, lower its settings")
    assert time.monotonic() - started < 5.0


def test_the_probe_stops_a_generator_over_its_memory(monkeypatch):
    monkeypatch.setattr(gym_probe, "PROBE_MEMORY_MB", 16)  # a 20-disk item: a million moves, over 100 MB
    registered()
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"^task.datasets\[0\].config: tower_of_hanoi needed more than 16 MiB "
                                          r"to generate 2 items \(min_disks=20, max_disks=20\): lower its settings$"):
        gym_probe.probe_generators(probe_task("tower_of_hanoi", {"min_disks": 20, "max_disks": 20}), 0)
    assert time.monotonic() - started < 30


def test_the_probe_passes_a_cheap_generator():
    gym_probe.probe_generators(probe_task("basic_arithmetic", {"max_terms": 3}), 0)


def test_a_failing_generator_is_one_line_before_any_worker_starts(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "short.txt").write_text("ab\ncd\n")  # no word of 5 letters or more: the generator has nothing to pick
    config = yaml.safe_load(open("configs/reasoning-gym.yaml"))
    config["task"]["datasets"] = [{"name": "spell_backward", "config": {
        "data_file": str(root / "short.txt"), "min_word_len": 5, "max_word_len": 10}}]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    started = time.monotonic()
    r = subprocess.run([*CLI, "train", "--config", str(path), "--steps", "1"], capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, gym_options.DATA_ROOTS_ENV: str(root)})
    elapsed = time.monotonic() - started
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("thundersync: invalid config: task.datasets[0].config: spell_backward failed "
                                "generating item 0: IndexError"), r.stderr
    assert "Traceback" not in r.stderr and "hangs" not in r.stderr and "starting" not in r.stderr
    assert elapsed < 25, elapsed  # python and reasoning_gym's import; no fleet, no exit deadline (33 s before)


def test_every_generator_with_a_file_option_is_enumerated_from_reasoning_gym():
    # the file options are found by the classification test above from the installed package;
    # this keeps the per-family tests honest: each names a registered generator and a real option
    for name, key in gym_options.FILE_OPTIONS:
        assert key in {f.name for f in dataclasses.fields(registered()[name][1])}
