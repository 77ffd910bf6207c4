"""Config YAML from untrusted users: aliases refused before expansion, size and node caps."""

import time

import pytest

from learner.config import ConfigError, load_config
from learner.safe_yaml import MAX_YAML_NODES, UnsafeYamlError, load_yaml


def alias_bomb(levels: int = 7, fanout: int = 9, size: int = 346) -> str:
    """``levels`` anchors, each a list of ``fanout`` aliases of the one before: fanout**levels
    leaves once expanded (the 346-byte, 9**7 one of the report), padded with a comment."""
    lines = ["a: &a [" + ", ".join(['"lol"'] * fanout) + "]"]
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * fanout) + "]")
    text = "\n".join(lines) + "\n"
    pad = size - len(text) - 3
    return f"# {'x' * pad}\n{text}" if pad >= 0 else text


def test_the_alias_bomb_is_refused_before_it_expands():
    bomb = alias_bomb()
    assert len(bomb.encode()) == 346
    started = time.thread_time()
    with pytest.raises(UnsafeYamlError, match=r"refused at line 2, column 4: anchors and aliases"):
        load_yaml(bomb)
    assert time.thread_time() - started < 0.05


@pytest.mark.parametrize("text", ["a: &x 1\nb: 2", "a: !!str &x 1", "a: [1]\nb: *x"])
def test_any_anchor_or_alias_is_refused(text):
    with pytest.raises(UnsafeYamlError, match="anchors and aliases"):
        load_yaml(text)


def test_size_and_node_caps():
    with pytest.raises(UnsafeYamlError, match="longer than 10 characters"):
        load_yaml("a: 12345678901", max_chars=10)
    many = "[" + ",".join(["1"] * MAX_YAML_NODES) + "]"
    with pytest.raises(UnsafeYamlError, match=f"more than {MAX_YAML_NODES} values"):
        load_yaml(many)


def test_plain_configs_still_load():
    assert load_yaml("train:\n  steps: 3\n  lr: 0.01\nname: x\n") == {"train": {"steps": 3, "lr": 0.01}, "name": "x"}


def test_the_cli_loader_shares_the_safe_parser(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    with pytest.raises(ConfigError, match="anchors and aliases"):
        load_config(path)


@pytest.mark.parametrize("text, reason", [
    ("steps: " + "9" * 5000, "a value cannot be read: Exceeds the limit"),  # Python's int digit limit
    ("a: " + "[" * 49_000 + "]" * 49_000, "nested deeper than 32 levels"),
    ("a:\n" + "".join(f"{'  ' * i}k{i}:\n" for i in range(1, 40)) + "  " * 40 + "v: 1\n", "nested deeper than 32"),
    ("a: !!timestamp 99999-01-01", "a value cannot be read"),
])
def test_every_loader_error_is_an_unsafe_yaml_error(text, reason):
    started = time.thread_time()
    with pytest.raises(UnsafeYamlError, match=reason):
        load_yaml(text)
    assert time.thread_time() - started < 0.2  # refused before the parse costs anything


def test_the_cli_exits_2_on_an_integer_over_4300_digits(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "huge.yaml"
    path.write_text("train:\n  steps: " + "9" * 5000 + "\n")
    result = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "a value cannot be read" in result.stderr and "Traceback" not in result.stderr


def test_text_over_the_character_cap_is_never_parsed(monkeypatch):
    import learner.safe_yaml as safe_yaml

    parsed = []
    monkeypatch.setattr(safe_yaml, "_parse", lambda *args: parsed.append(args))
    with pytest.raises(UnsafeYamlError, match="longer than 1000 characters"):
        load_yaml("a: 1\n" * 201, max_chars=1000)
    assert parsed == []


def test_text_over_the_value_cap_is_refused_before_anything_is_built(monkeypatch):
    """The events are read up to the first value over the cap, and the constructors never run."""
    import yaml

    import learner.safe_yaml as safe_yaml

    if safe_yaml._C_LOADER is None:
        pytest.skip("without libyaml the pure-Python composer refuses it (test_size_and_node_caps)")
    events, built = [], []
    real_parse = yaml.parse

    def counted(text, Loader):  # noqa: N803 (yaml's name)
        for event in real_parse(text, Loader=Loader):
            events.append(event)
            yield event

    monkeypatch.setattr(safe_yaml.yaml, "parse", counted)
    monkeypatch.setattr(safe_yaml.yaml, "load", lambda *a, **k: built.append(a))
    text = "a: [" + ", ".join(["1"] * 5000) + "]\n"
    with pytest.raises(UnsafeYamlError, match="more than 100 values"):
        load_yaml(text, max_nodes=100)
    assert built == [] and len(events) < 110  # stream, document, mapping, key, list, 100 items


def test_the_c_loader_gives_what_the_python_loader_gives():
    import yaml

    text = ("name: x\ntrain: {steps: 3, lr: 5.0e-4, schedule: streaming}\nrollout:\n  temperature: 1.0\n"
            "  stop: ['\\n', 'END']\ntask:\n  datasets: [{name: chain_sum, weight: 2}]\nflag: yes\nempty:\n")
    assert load_yaml(text) == yaml.load(text, Loader=yaml.SafeLoader)  # noqa: S506
