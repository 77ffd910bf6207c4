"""Tasks from data (``dataset``) and ``reasoning-gym``: loading, bad data, rewards, order, split."""

from __future__ import annotations

import json
import math
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from learner.config import TaskConfig
from learner.tasks.data_env import DatasetEnv, ReasoningGymEnv
from learner.tasks.env import task_for_group
from learner.tasks.registry import make_env
from learner.tasks.rewards import RewardError, load_reward
from learner.tasks.task_data import TaskDataError, load_rows, resolve_path

ROWS = [{"question": f"{a}+{a}=?", "answer": str(2 * a), "n": a} for a in range(1, 21)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def dataset(path: Path, **extra) -> TaskConfig:
    return TaskConfig(name="dataset", path=str(path), prompt_field="question", answer_field="answer", **extra)


# ---------------------------------------------------------------- bad data: exact errors


def test_a_missing_field_names_the_line_and_the_field(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], {"answer": "4"}])
    with pytest.raises(TaskDataError) as err:
        load_rows(dataset(path))
    assert str(err.value) == "task.path: bad.jsonl line 2: field 'question' (task.prompt_field) is missing"


def test_non_utf8_names_the_line_and_the_byte(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(json.dumps(ROWS[0]).encode() + b'\n{"question": "\xff"}\n')
    with pytest.raises(TaskDataError) as err:
        load_rows(dataset(path))
    assert str(err.value) == "task.path: bad.jsonl line 2: not valid UTF-8 (byte 0xff at offset 14)"


def test_an_empty_file_is_an_error_whatever_on_bad_data_says(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    for mode in ("error", "score-zero"):
        with pytest.raises(TaskDataError) as err:
            load_rows(dataset(path, on_bad_data=mode))
        assert str(err.value) == "task.path: empty.jsonl is empty"


def test_a_csv_with_a_bad_byte_names_its_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(b"question,answer\n1+1=?,2\n2+2=?,\xfe4\n")
    with pytest.raises(TaskDataError) as err:
        load_rows(dataset(path))
    assert str(err.value) == "task.path: bad.csv line 3: not valid UTF-8 (byte 0xfe at offset 6)"


def reward_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def boom(completion, answer, row):\n    return 1 / 0\n\n"
        "def nan(completion, answer, row):\n    return float('nan')\n\n"
        "def text(completion, answer, row):\n    return 'yes'\n\n"
        "def by_row(completion, answer, row):\n    return 1 / 0 if row['n'] == 3 else float(completion == answer)\n\n"
        "def hang(completion, answer, row):\n    import time\n    time.sleep(3600)\n\n"
        "def spin(completion, answer, row):\n    while True:\n        pass\n\n"
        "def swallow(completion, answer, row):\n    import time\n    try:\n        time.sleep(3600)\n"
        "    except Exception:\n        return 1.0\n"
    )
    return path


@pytest.mark.parametrize(("function", "reason"), [
    ("boom", "raised ZeroDivisionError: division by zero"),
    ("nan", "returned nan"),
    ("text", "returned str 'yes', not a number"),
])
def test_a_failing_reward_stops_with_the_row_named(tmp_path, function, reason):
    data = write_jsonl(tmp_path / "x.jsonl", ROWS[:2])
    spec = f"{reward_file(tmp_path)}:{function}"
    env = DatasetEnv(dataset(data, reward=spec, shuffle=False))
    task = task_for_group(env, 0, seed=0)
    with pytest.raises(RewardError) as err:
        env.score(task, "2")
    assert str(err.value) == f"task.reward: {spec} {reason} (x.jsonl line 1)"


@pytest.mark.parametrize("function", ["hang", "spin", "swallow"])
def test_a_reward_that_hangs_fails_at_its_timeout(tmp_path, function):
    data = write_jsonl(tmp_path / "x.jsonl", ROWS[:2])
    spec = f"{reward_file(tmp_path)}:{function}"
    env = DatasetEnv(dataset(data, reward=spec, shuffle=False, reward_timeout_s=0.3))
    task = task_for_group(env, 0, seed=0)
    started = time.monotonic()
    with pytest.raises(RewardError) as err:
        env.score(task, "2")
    assert time.monotonic() - started < 3
    assert str(err.value) == f"task.reward: {spec} did not return within task.reward_timeout_s = 0.3s (x.jsonl line 1)"
    zero = DatasetEnv(dataset(data, reward=spec, shuffle=False, reward_timeout_s=0.3, on_bad_data="score-zero"))
    assert zero.score(task_for_group(zero, 0, seed=0), "2") == (0.0, str(err.value))
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # disarmed after each call


def test_score_zero_skips_bad_rows_and_scores_failing_rewards_zero_with_a_reason(tmp_path):
    rows = [ROWS[0], {"answer": "4"}, {"question": "3+3=?"}, *ROWS[3:5]]
    data = write_jsonl(tmp_path / "x.jsonl", rows)
    cfg = dataset(data, reward=f"{reward_file(tmp_path)}:boom", on_bad_data="score-zero", shuffle=False)
    env = DatasetEnv(cfg)
    loaded = env.rows(0)
    assert loaded.skipped == 1 and loaded.reasons == [
        "task.path: x.jsonl line 2: field 'question' (task.prompt_field) is missing"]
    assert [r.where for r in loaded.train] == ["x.jsonl line 1", "x.jsonl line 3", "x.jsonl line 4", "x.jsonl line 5"]
    no_answer = task_for_group(env, 1, seed=0)
    assert env.score(no_answer, "6") == (
        0.0, "task.path: x.jsonl line 3: field 'answer' (task.answer_field) is missing")
    assert env.score(task_for_group(env, 0, seed=0), "2") == (
        0.0, f"task.reward: {cfg.reward} raised ZeroDivisionError: division by zero (x.jsonl line 1)")


def test_bad_json_and_a_file_with_no_usable_row(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"question": "1+1=?", "answer": "2"}\n{"question": oops}\n')
    with pytest.raises(TaskDataError, match=r"^task.path: x.jsonl line 2: not valid JSON \(Expecting value at column 14\)$"):
        load_rows(dataset(path))
    path.write_text('["a list"]\n')
    with pytest.raises(TaskDataError) as err:
        load_rows(dataset(path, on_bad_data="score-zero"))
    assert str(err.value) == ("task.path: x.jsonl has no usable row (1 skipped; first: "
                              "task.path: x.jsonl line 1: expected a JSON object, got list)")


def test_reward_specs_that_cannot_load_say_why(tmp_path):
    with pytest.raises(RewardError, match=r"^task.reward: nofile.py does not exist$"):
        load_reward("nofile.py:score")
    with pytest.raises(RewardError, match=r"has no function 'missing'$"):
        load_reward(f"{reward_file(tmp_path)}:missing")
    with pytest.raises(RewardError, match=r"^task.reward: 'lenient' is not a built-in"):
        load_reward("lenient")
    with pytest.raises(RewardError, match=r"^task.reward_pattern: not a valid regular expression"):
        load_reward("regex", "(")


# ---------------------------------------------------------------- formats, order, split


def test_parquet_csv_and_a_datasets_directory_give_the_same_rows(tmp_path):
    import datasets

    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(str(tmp_path / "d.parquet"))
    table.to_csv(str(tmp_path / "d.csv"), index=False)
    table.save_to_disk(str(tmp_path / "saved"))
    write_jsonl(tmp_path / "d.jsonl", ROWS)
    expected = [(r["question"], r["answer"]) for r in ROWS]
    for name in ("d.jsonl", "d.parquet", "d.csv", "saved"):
        rows = load_rows(dataset(tmp_path / name)).train
        assert [(r.prompt, r.answer) for r in rows] == expected, name


def test_order_is_a_fresh_permutation_per_epoch_and_seed(tmp_path):
    env = DatasetEnv(dataset(write_jsonl(tmp_path / "d.jsonl", ROWS)))
    prompts = lambda seed, n: [task_for_group(env, g, seed).messages[-1]["content"] for g in range(n)]  # noqa: E731
    first = prompts(0, 40)
    assert first == prompts(0, 40)  # the same seed: the same stream
    assert sorted(first[:20]) == sorted(first[20:]) == sorted(r["question"] for r in ROWS)  # each epoch: every row once
    assert first[:20] != first[20:] and first[:20] != prompts(1, 20)
    plain = DatasetEnv(dataset(write_jsonl(tmp_path / "d.jsonl", ROWS), shuffle=False))
    assert [task_for_group(plain, g, 5).answer for g in range(3)] == ["2", "4", "6"]


def test_epochs_bound_the_run(tmp_path):
    env = DatasetEnv(dataset(write_jsonl(tmp_path / "d.jsonl", ROWS), epochs=2))
    env.check(0, groups_needed=40)
    with pytest.raises(TaskDataError) as err:
        env.check(0, groups_needed=41)
    assert str(err.value) == "task.epochs: the run asks for 41 prompts but 2 epoch(s) of 20 training rows hold 40"


def test_the_eval_split_is_held_out_and_fixed_by_the_seed(tmp_path):
    env = DatasetEnv(dataset(write_jsonl(tmp_path / "d.jsonl", ROWS), eval_fraction=0.25))
    held = [t.answer for t in env.eval_tasks(0, 100)]
    train = {task_for_group(env, g, 0).answer for g in range(15)}
    assert len(held) == 5 and len(train) == 15 and not train & set(held)
    assert held == [t.answer for t in env.eval_tasks(0, 100)] and held != [t.answer for t in env.eval_tasks(1, 100)]


def test_relative_paths_fall_back_to_the_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_path("configs/data/math.jsonl").is_file()
    assert load_rows(dataset(Path("configs/data/math.jsonl"))).train[0].where == "math.jsonl line 1"


# ---------------------------------------------------------------- rewards


@pytest.mark.parametrize(("spec", "pattern", "completion", "answer", "expected"), [
    ("exact-match", None, "  42 ", "42", 1.0),
    ("exact-match", None, "the answer is 42", "42", 0.0),
    ("exact-match", None, "<answer>a  b</answer>", "a b", 1.0),
    ("regex", r"answer is (-?\d+)", "so the answer is 42.", "42", 1.0),
    ("regex", r"answer is (-?\d+)", "no idea", "42", 0.0),
    ("math-verify", None, "The result is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
    ("math-verify", None, "<answer>44</answer>", "44", 1.0),
    ("math-verify", None, "\\boxed{3}", "0.5", 0.0),
])
def test_builtin_rewards(tmp_path, spec, pattern, completion, answer, expected):
    data = write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": answer}])
    env = DatasetEnv(dataset(data, reward=spec, reward_pattern=pattern))
    assert env.score(task_for_group(env, 0, 0), completion) == (expected, None)


def test_a_module_function_reward_gets_the_row(tmp_path, monkeypatch):
    (tmp_path / "scoring_pkg.py").write_text("def score(completion, answer, row):\n    return row['n'] / 10\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = DatasetEnv(dataset(write_jsonl(tmp_path / "d.jsonl", ROWS), reward="scoring_pkg:score", shuffle=False))
    assert env.score(task_for_group(env, 6, 0), "anything") == (0.7, None)


# ---------------------------------------------------------------- reasoning-gym


def gym(**extra) -> TaskConfig:
    return TaskConfig(name="reasoning-gym", datasets=[
        {"name": "basic_arithmetic", "weight": 3, "config": {"max_terms": 2, "max_digits": 2}},
        {"name": "chain_sum", "weight": 1}], size=500, **extra)


def test_reasoning_gym_is_deterministic_per_seed_and_mixes_by_weight():
    env = make_env(gym())
    stream = lambda seed: [task_for_group(env, g, seed) for g in range(200)]  # noqa: E731
    a, b, other = stream(3), stream(3), stream(4)
    assert [t.messages for t in a] == [t.messages for t in b]
    assert [t.messages for t in a] != [t.messages for t in other]
    share = Counter(t.meta["entry"]["metadata"]["source_dataset"] for t in a)["basic_arithmetic"] / len(a)
    assert 0.6 < share < 0.9  # weight 3 of 4
    evals = make_env(gym()).eval_tasks(3, 20)  # another seed than training's: other items
    assert [t.messages for t in evals] == [t.messages for t in env.eval_tasks(3, 20)]
    assert [t.messages for t in evals] != [t.messages for t in a[:20]]


def test_reasoning_gym_scores_with_its_own_verifiers():
    env = make_env(gym())
    task = task_for_group(env, 0, seed=0)
    assert task.messages[0]["role"] == "system" and "<answer>" in task.messages[0]["content"]
    assert env.score(task, f"I think <answer>{task.answer}</answer>") == (1.0, None)
    assert env.score(task, str(task.answer)) == (1.0, None)  # the built-in format's <ans> payload
    assert env.score(task, "<answer>nope</answer>")[0] == 0.0


def test_reasoning_gym_names_an_unknown_dataset():
    from learner.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as err:  # when the config is read (learner/gym_options.py)
        parse_config({"task": {"name": "reasoning-gym", "datasets": [{"name": "nope"}]}})
    assert str(err.value) == "task.datasets[0].name: unknown reasoning-gym dataset 'nope'"
    with pytest.raises(ValueError) as err:  # and by the environment, for a config built without validation
        ReasoningGymEnv(TaskConfig.model_construct(name="reasoning-gym", datasets=[
            type("Spec", (), {"name": "nope", "weight": 1.0, "config": {}})()]))
    assert str(err.value) == "task.datasets[0].name: unknown reasoning-gym dataset 'nope'"


def test_config_requires_what_each_task_needs():
    from pydantic import ValidationError

    for kwargs, message in [({"name": "dataset"}, "path: a dataset task needs task.path"),
                            ({"name": "reasoning-gym"}, "datasets: a reasoning-gym task needs at least one dataset"),
                            ({"name": "dataset", "path": "x.jsonl", "reward": "regex"}, "reward_pattern: reward 'regex'")]:
        with pytest.raises(ValidationError, match=message):
            TaskConfig(**kwargs)
    assert math.isclose(TaskConfig(name="dataset", path="x", eval_fraction=0.5).eval_fraction, 0.5)
