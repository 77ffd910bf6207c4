"""arith-tool: calculator, task sampling, canonical traces, verifier, latency model, registry."""

from __future__ import annotations

import random
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.config import TaskConfig, ToolLatency
from learner.tasks import registry as tasks_module
from learner.tasks.env import (
    STOP_TOKENS,
    ArithToolEnv,
    Task,
    calculator,
    canonical_turns,
    draw_tool_latency,
    evaluate,
)
from learner.tasks.sandbox_task import PythonSandboxEnv
from learner.tasks.registry import BUILTIN_TASKS, make_env, register_env


@pytest.mark.parametrize(
    ("call", "expected"),
    [("3*4", "12"), ("12+12", "24"), ("5-17", "-12"), ("-14+2", "-12"), (" 7 * -3 ", "-21"),
     ("999999999999999*999", "998999999999999001")],
)
def test_calculator_does_one_binary_operation(call, expected):
    assert calculator(call) == expected


@pytest.mark.parametrize(
    "call", ["1+2+3", "2**3", "8/2", "", "12", "__import__('os').system('true')", "1e3+1", "(1+2)", "1" * 41 + "+1"]
)
def test_calculator_answers_error_to_anything_else(call):
    assert calculator(call) == "error"


expressions = st.builds(
    lambda first, rest: str(first) + "".join(op + str(x) for op, x in rest),
    st.integers(1, 999),
    st.lists(st.tuples(st.sampled_from("+-*"), st.integers(1, 999)), min_size=1, max_size=5),
)


@settings(max_examples=200, deadline=None)
@given(expressions)
def test_evaluate_and_canonical_trace_agree_with_python_precedence(expression):
    assert re.fullmatch(r"[\d+\-*]+", expression)  # digits and operators only: eval is a safe oracle here
    truth = eval(expression)
    assert evaluate(expression) == truth
    task = Task(prompt_text="", answer=truth, expression=expression)
    turns = canonical_turns(task)
    n_ops = sum(expression.count(op) for op in "+-*")
    assert len(turns) == n_ops + 1
    assert turns[-1] == (f"<ans>{truth}</ans><eos>", None)


def test_canonical_trace_calls_the_product_first():
    task = Task(prompt_text="<bos>Q:12+3*4=?\n", answer=24, expression="12+3*4")
    assert canonical_turns(task) == [
        ("<call>3*4</call>", "<obs>12</obs>"),
        ("<call>12+12</call>", "<obs>24</obs>"),
        ("<ans>24</ans><eos>", None),
    ]


def test_sample_task_respects_the_config():
    config = TaskConfig(min_ops=2, max_ops=3, max_operand=9, max_turns=6)
    env = ArithToolEnv(config)
    rng = random.Random(0)
    seen_ops = set()
    for _ in range(300):
        task = env.sample_task(rng)
        operands = [int(x) for x in re.findall(r"\d+", task.expression)]
        n_ops = len(operands) - 1
        seen_ops.add(n_ops)
        assert 2 <= n_ops <= 3
        assert all(1 <= x <= 9 for x in operands)
        assert task.prompt_text == f"<bos>Q:{task.expression}=?\n"
        assert task.answer == eval(task.expression)
        assert task.max_turns == 6
    assert seen_ops == {2, 3}


def test_sampling_is_deterministic_given_the_rng():
    env = ArithToolEnv(TaskConfig())
    first = [env.sample_task(random.Random(7)) for _ in range(3)]
    assert first[0] == first[1] == first[2]


def test_replaying_the_canonical_trace_through_the_env_earns_reward_one():
    env = ArithToolEnv(TaskConfig(max_ops=4, max_turns=5))
    rng = random.Random(1)
    for _ in range(100):
        task = env.sample_task(rng)
        *calls, (answer_turn, _) = canonical_turns(task)
        for turn, observation in calls:
            parsed = env.parse_turn(task, turn)
            assert parsed.kind == "tool"
            assert env.observation_text(env.run_tool(parsed.payload)) == observation
        assert env.parse_turn(task, answer_turn).kind == "final"
        assert env.reward(task, answer_turn) == 1.0
        assert len(calls) + 1 <= task.max_turns


@pytest.mark.parametrize(
    ("turn", "kind", "payload"),
    [
        ("<call>3*4</call>", "tool", "3*4"),
        ("<ans>24</ans><eos>", "final", "24"),
        ("<ans>24</ans>", "final", "24"),
        ("<call>3*4<eos>", "invalid", "<call>3*4<eos>"),
        ("24", "invalid", "24"),
        ("x<call>3*4</call>", "invalid", "x<call>3*4</call>"),
    ],
)
def test_parse_turn_tells_calls_answers_and_garbage_apart(turn, kind, payload):
    env = ArithToolEnv(TaskConfig())
    result = env.parse_turn(Task("", 24, "12+3*4"), turn)
    assert (result.kind, result.payload) == (kind, payload)


@pytest.mark.parametrize(
    ("final_text", "reward"),
    [("<ans>24</ans><eos>", 1.0), ("24", 1.0), ("<ans>25</ans><eos>", 0.0), ("<ans>2 4</ans><eos>", 0.0),
     ("<ans></ans><eos>", 0.0), ("<call>24</call>", 0.0), ("<ans>24.0</ans><eos>", 0.0)],
)
def test_reward_is_one_only_for_the_exact_integer(final_text, reward):
    env = ArithToolEnv(TaskConfig())
    assert env.reward(Task("", 24, "12+3*4"), final_text) == reward


def test_stop_tokens_end_calls_and_answers():
    assert STOP_TOKENS == ("</call>", "<eos>")


def test_tool_latency_model_follows_its_distribution():
    rng = random.Random(0)
    lognormal = ToolLatency(distribution="lognormal", median_s=0.05, sigma=0.8, scale=2.0)
    draws = [draw_tool_latency(lognormal, rng) for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(0.1, rel=0.1)  # median_s * scale
    assert max(draws) > 3 * 0.1  # a long right tail
    assert draw_tool_latency(ToolLatency(distribution="constant", median_s=0.2, scale=3.0), rng) == pytest.approx(0.6)
    assert draw_tool_latency(ToolLatency(distribution="none"), rng) == 0.0
    env = ArithToolEnv(TaskConfig(tool_latency=ToolLatency(distribution="constant", median_s=0.01)))
    assert env.tool_latency_s(rng) == pytest.approx(0.01)


def test_pareto_tool_latency_has_its_median_its_power_tail_and_its_cut():
    rng = random.Random(0)
    pareto = ToolLatency(distribution="pareto", median_s=0.02, alpha=1.2, scale=1.0)
    draws = sorted(draw_tool_latency(pareto, rng) for _ in range(20000))
    assert statistics.median(draws) == pytest.approx(0.02, rel=0.05)
    # P(X > x) = 0.5 (x / median)^-alpha: 10x the median is passed by 0.5 * 10^-1.2 = 3.2% of draws
    assert sum(d > 0.2 for d in draws) / len(draws) == pytest.approx(0.5 * 10 ** -1.2, rel=0.15)
    assert min(draws) >= 0.02 * 2 ** (-1 / 1.2) - 1e-12  # the scale parameter: no draw below it
    cut = ToolLatency(distribution="pareto", median_s=0.02, alpha=1.2, max_s=0.5, scale=3.0)
    capped = [draw_tool_latency(cut, rng) for _ in range(5000)]
    assert max(capped) == pytest.approx(1.5)  # cut to max_s, then scaled: linear in the scale
    with pytest.raises(ValueError, match="alpha"):
        ToolLatency(distribution="pareto", alpha=1.0)  # no finite mean


class CountdownEnv(ArithToolEnv):
    name = "countdown"


def test_registry_builds_user_environments(monkeypatch):
    monkeypatch.setattr(tasks_module, "_REGISTRY", dict(tasks_module._REGISTRY))
    register_env("countdown", CountdownEnv)
    built = make_env(TaskConfig.model_construct(**{**TaskConfig().model_dump(), "name": "countdown"}))
    assert isinstance(built, CountdownEnv)
    assert type(make_env(TaskConfig())) is ArithToolEnv
    assert type(make_env(TaskConfig(name="python-sandbox"))) is PythonSandboxEnv
    register_env("arith-tool", CountdownEnv)  # a user's factory wins over the built-in of that name
    assert type(make_env(TaskConfig())) is CountdownEnv


def test_make_env_names_an_unknown_task():
    with pytest.raises(ValueError, match=r"task.name: unknown environment 'nope' \(registered: .*arith-tool") as err:
        make_env(TaskConfig.model_construct(**{**TaskConfig().model_dump(), "name": "nope"}))
    assert all(name in str(err.value) for name in BUILTIN_TASKS)
