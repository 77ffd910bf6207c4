"""Agent tasks: the ``Environment`` protocol and the built-in ``arith-tool`` task.

Text format of one ``arith-tool`` episode (every tag is one special token)::

    <bos>Q:12+3*4=?\\n                  prompt (not scored)
    <call>3*4</call>                     policy turn, ends at the stop token </call>
    <obs>12</obs>                        environment observation (not scored, loss_mask 0)
    <call>12+12</call>                   policy turn
    <obs>24</obs>
    <ans>24</ans><eos>                   final policy turn, ends at the stop token <eos>

The calculator evaluates exactly one binary operation on integers, so an expression with
n operators needs n tool calls: episodes are multi-turn with varied turn counts.

Episode rules the agent loop applies (this module stays stateless):
- a turn is counted each time the policy generates one (tool calls and the final answer);
  a trajectory that has not answered after ``task.max_turns`` turns gets reward 0;
- an ``invalid`` turn (neither a well-formed call nor an answer) ends the episode, reward 0.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from learner.config import TaskConfig, ToolLatency
from learner.tasks.char_tokenizer import ANS, ANS_END, BOS, CALL, CALL_END, EOS, OBS, OBS_END
from learner.timeline import Metric

STOP_TOKENS: tuple[str, ...] = (CALL_END, EOS)

_INT = r"-?\d{1,40}"  # bounded so int() stays cheap; 999 to the 5th has 15 digits
_BINARY_OP = re.compile(rf"^\s*({_INT})\s*([+\-*])\s*({_INT})\s*$")
_CALL_TURN = re.compile(rf"^{re.escape(CALL)}(.*?){re.escape(CALL_END)}$", re.DOTALL)
_ANS_TURN = re.compile(rf"^{re.escape(ANS)}(.*?){re.escape(ANS_END)}(?:{re.escape(EOS)})?$", re.DOTALL)
_ANSWER_INT = re.compile(rf"^\s*({_INT})\s*$")
_PRECEDENCE = {"+": 0, "-": 0, "*": 1}


@dataclass
class Task:
    prompt_text: str  # e.g. "<bos>Q:12+3*4=?\n" (the built-in format, without a chat template)
    answer: Any  # arith-tool: int; data tasks: the reference text
    expression: str  # e.g. "12+3*4"; data tasks: where the task came from ("math.jsonl line 3")
    max_turns: int = 4  # policy turns allowed, the final answer included
    # the prompt as chat messages, rendered with the policy's chat template (learner.tasks.chat)
    messages: list[dict] | None = None
    meta: dict | None = None  # what the task's verifier needs besides the answer (a row, an entry)


@dataclass
class TurnResult:
    kind: Literal["tool", "final", "invalid"]
    payload: str  # the call text ("3*4") or the answer text ("24"); the raw turn if invalid
    error: str | None = None  # why an invalid turn is invalid, when there is more to say


@dataclass(frozen=True)
class ToolSpec:
    """A tool the policy may call, with its single argument (the payload ``run_tool`` takes)."""

    name: str
    argument: str
    description: str

    def schema(self) -> dict:
        """The OpenAI-style function schema chat templates render into the system prompt."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description,
            "parameters": {"type": "object", "properties": {self.argument: {"type": "string"}},
                           "required": [self.argument]},
        }}


class Environment(Protocol):
    """What the agent loop needs from a task. Implement it for your own task and register a
    factory taking the ``TaskConfig`` (``learner.tasks.registry.register_env``)."""

    name: str
    # the environment is a pure function of the history: the same tool call after the same
    # turns gives the same result, so a draft's tool results may be kept (docs/speculation.md)
    pure_history: bool

    def sample_task(self, rng: random.Random) -> Task: ...

    def parse_turn(self, task: Task, turn_text: str) -> TurnResult: ...

    def run_tool(self, call: str) -> str:
        """Do the tool's real work and return its output text (no modelled waiting)."""
        ...

    def observation_text(self, tool_output: str) -> str: ...

    def reward(self, task: Task, final_text: str) -> float: ...

    def tool_latency_s(self, rng: random.Random) -> float:
        """Seconds the caller should wait after ``run_tool``: a latency MODEL (see
        ``draw_tool_latency``), not a measurement."""
        ...


def calculator(call: str) -> str:
    """Evaluate exactly one binary operation ``a+b``, ``a-b`` or ``a*b`` on integers.

    Parsed with a regular expression, never ``eval``; anything else returns ``"error"``.
    """
    m = _BINARY_OP.match(call)
    if m is None:
        return "error"
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return str(a + b if op == "+" else a - b if op == "-" else a * b)


def draw_tool_latency(latency: ToolLatency, rng: random.Random) -> float:
    """A labelled MODEL of real agent tool time (the calculator itself answers in µs).

    lognormal: median_s · exp(sigma · z), z ~ N(0, 1) (so median_s is the median);
    pareto: median_s · (2u)^(-1/alpha), u ~ U(0, 1] (median median_s; P(X > x) falls as
    x^-alpha, the heavy tail of SWE-style tools: most calls quick, a few test runs or builds
    orders of magnitude longer); constant: median_s; none: 0. A draw is cut to ``max_s`` if
    set, then multiplied by ``scale`` (so R stays linear in the scale, docs/bench.md).
    """
    if latency.distribution == "none":
        return 0.0
    if latency.distribution == "constant":
        raw = latency.median_s
    elif latency.distribution == "pareto":
        raw = latency.median_s * (2.0 * (1.0 - rng.random())) ** (-1.0 / latency.alpha)
    else:
        raw = latency.median_s * math.exp(latency.sigma * rng.gauss(0.0, 1.0))
    return (raw if latency.max_s is None else min(raw, latency.max_s)) * latency.scale


def _tokens(expression: str) -> list[str]:
    """'12+3*4' -> ['12', '+', '3', '*', '4'] (operands are positive literals)."""
    return re.findall(r"\d+|[+\-*]", expression)


def _reduce_once(tokens: list[str]) -> tuple[str, list[str]]:
    """Pick the leftmost operator of highest precedence, return its single-op call and the
    token list with that operation replaced by its result (standard left-to-right order)."""
    ops = range(1, len(tokens), 2)
    i = max(ops, key=lambda j: (_PRECEDENCE[tokens[j]], -j))
    call = f"{tokens[i - 1]}{tokens[i]}{tokens[i + 1]}"
    return call, tokens[: i - 1] + [calculator(call)] + tokens[i + 2 :]


def evaluate(expression: str) -> int:
    """The true value with standard precedence, by repeated single-operation reduction."""
    tokens = _tokens(expression)
    while len(tokens) > 1:
        _, tokens = _reduce_once(tokens)
    return int(tokens[0])


class ArithToolEnv:
    """``arith-tool``: integer expressions solved through a one-operation calculator."""

    name = "arith-tool"
    pure_history = True  # a calculator
    TOOLS = (ToolSpec("calculator", "expression", "Evaluate one binary operation a+b, a-b or a*b on integers"),)

    def __init__(self, config: TaskConfig):
        self.config = config

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return self.TOOLS

    def sample_task(self, rng: random.Random) -> Task:
        n_ops = rng.randint(self.config.min_ops, self.config.max_ops)
        parts = [str(rng.randint(1, self.config.max_operand))]
        for _ in range(n_ops):
            parts += [rng.choice("+-*"), str(rng.randint(1, self.config.max_operand))]
        expression = "".join(parts)
        question = f"{expression}=?" if self.config.prompt_preamble is None else \
            f"{self.config.prompt_preamble}\n{expression}=?"
        return Task(
            prompt_text=f"{BOS}Q:{question}\n",
            answer=evaluate(expression),
            expression=expression,
            max_turns=self.config.max_turns,
            messages=[{"role": "user", "content": question}],
        )

    def parse_turn(self, task: Task, turn_text: str) -> TurnResult:
        if m := _CALL_TURN.match(turn_text):
            return TurnResult("tool", m.group(1))
        if m := _ANS_TURN.match(turn_text):
            return TurnResult("final", m.group(1))
        return TurnResult("invalid", turn_text)

    def run_tool(self, call: str) -> str:
        return calculator(call)

    def observation_text(self, tool_output: str) -> str:
        return f"{OBS}{tool_output}{OBS_END}"

    def reward(self, task: Task, final_text: str) -> float:
        """1.0 iff ``final_text`` (a whole answer turn or just its payload) is an integer
        equal to the true value; malformed answers get 0.0."""
        parsed = self.parse_turn(task, final_text)
        payload = parsed.payload if parsed.kind == "final" else final_text
        m = _ANSWER_INT.match(payload)
        return 1.0 if m is not None and int(m.group(1)) == task.answer else 0.0

    def tool_latency_s(self, rng: random.Random) -> float:
        return draw_tool_latency(self.config.tool_latency, rng)


def canonical_turns(task: Task) -> list[tuple[str, str | None]]:
    """The reference solution used for SFT: one single-operation call per operator in
    precedence order, each followed by its observation, then the answer turn.

    Returns ``[(assistant_turn_text, observation_text_or_None), ...]``.
    """
    turns: list[tuple[str, str | None]] = []
    tokens = _tokens(task.expression)
    while len(tokens) > 1:
        call, tokens = _reduce_once(tokens)
        turns.append((f"{CALL}{call}{CALL_END}", f"{OBS}{calculator(call)}{OBS_END}"))
    turns.append((f"{ANS}{tokens[0]}{ANS_END}{EOS}", None))
    return turns


def task_for_group(env: Environment, group: int, seed: int) -> Task:
    """The prompt of group ``group``: a data task's row in its epoch order (``task_at``), or
    a draw from a generator seeded by (run seed, group) for procedural tasks."""
    task_at = getattr(env, "task_at", None)
    if task_at is not None:
        return task_at(group, seed)
    return env.sample_task(random.Random(seed * 1_000_003 + group))


def score_final(env: Environment, task: Task, answer_text: str) -> tuple[float, str | None]:
    """(reward, the reason it was scored 0 instead of failing the run, or None): data tasks
    report a counted failure (``score``); arith-tool's verifier cannot fail."""
    score = getattr(env, "score", None)
    if score is not None:
        return score(task, answer_text)
    return env.reward(task, answer_text), None


def task_metrics(trajs) -> dict[str, float]:
    """Per-step counts of trajectories scored 0 instead of failing the run: a malformed
    turn (e.g. a tool call that is not valid JSON) or a counted data/reward error."""
    errors = [t.error for t in trajs if t.error]
    turn = sum(1 for e in errors if e.startswith("turn "))
    return {Metric.TASK_TURN_ERRORS: float(turn), Metric.TASK_REWARD_ERRORS: float(len(errors) - turn)}
