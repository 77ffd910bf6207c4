"""Tasks from data: ``dataset`` (rows of a file, a reward function) and ``reasoning-gym``
(procedural datasets with their own verifiers). docs/tasks.md is the user's guide.

Both give the i-th group of a run the i-th item of a stream that depends only on the run
seed (``task_at``), so a run is reproducible; both answer in the built-in tag format
(``<ans>...</ans>``, tool calls ``<call>...</call>``) or, for chat models that call tools
in JSON, through ``learner.tasks.chat``. ``task.tools`` names the one tool the policy may
call: ``calculator`` (arith-tool's) or ``python-sandbox`` (``learner.tasks.sandbox``).
"""

from __future__ import annotations

import random
import re
from functools import cached_property

from learner.config import TaskConfig
from learner.tasks.env import Task, ToolSpec, TurnResult, calculator, draw_tool_latency
from learner.tasks.rewards import RewardError, checked_score, load_reward
from learner.tasks.task_data import DataRows, TaskDataError, epoch_order, load_rows, split
from learner.tasks.char_tokenizer import ANS, ANS_END, CALL, CALL_END, EOS, OBS, OBS_END

_CALL_TURN = re.compile(rf"^{re.escape(CALL)}(.*?){re.escape(CALL_END)}$", re.DOTALL)
_ANS_TURN = re.compile(rf"^{re.escape(ANS)}(.*?){re.escape(ANS_END)}(?:{re.escape(EOS)})?$", re.DOTALL)
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
EVAL_SEED_OFFSET = 1_000_000_007  # reasoning-gym's eval items come from another seed than training's


class TagTurns:
    """Turn parsing in the built-in tag format, and the python-sandbox tool, for data tasks."""

    config: TaskConfig
    TOOLS = {
        "calculator": ToolSpec("calculator", "expression", "Evaluate one binary operation a+b, a-b or a*b on integers"),
        "python-sandbox": ToolSpec("python", "code", "Run a Python program in a sandbox and return what it prints"),
    }

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        return tuple(self.TOOLS[name] for name in self.config.tools)

    def parse_turn(self, task: Task, turn_text: str) -> TurnResult:
        if m := _ANS_TURN.match(turn_text):
            return TurnResult("final", m.group(1))
        if m := _CALL_TURN.match(turn_text):
            if not self.config.tools:
                return TurnResult("invalid", turn_text, error="a tool call, but task.tools is empty")
            return TurnResult("tool", m.group(1))
        return TurnResult("invalid", turn_text)

    def run_tool(self, call: str) -> str:
        if self.config.tools == ["calculator"]:
            return calculator(call)
        from learner.tasks.sandbox_task import sandbox_tool

        return sandbox_tool(call)  # the call is a program: what it prints is the observation

    def observation_text(self, tool_output: str) -> str:
        return f"{OBS}{tool_output}{OBS_END}"

    def tool_latency_s(self, rng: random.Random) -> float:
        return draw_tool_latency(self.config.tool_latency, rng) if self.config.tools else 0.0

    def messages(self, prompt: str) -> list[dict]:
        system = [{"role": "system", "content": self.config.system_prompt}] if self.config.system_prompt else []
        return [*system, {"role": "user", "content": prompt}]

    def max_turns(self) -> int:
        return self.config.max_turns if self.config.tools else 1


def answer_text(turn_text: str) -> str:
    """The answer inside ``<answer>`` tags when there are some (reasoning-gym's prompt asks
    for them), else the whole turn."""
    tagged = _ANSWER_TAG.findall(turn_text)
    return tagged[-1].strip() if tagged else turn_text


class DatasetEnv(TagTurns):
    """``dataset``: one prompt per row of ``task.path``, scored by ``task.reward``."""

    name = "dataset"
    pure_history = True  # rows of a fixed data set, scored by their answers

    def __init__(self, config: TaskConfig):
        self.config = config
        self.reward_fn = load_reward(config.reward, config.reward_pattern)  # a bad spec fails at once
        self._rows: dict[int, DataRows] = {}

    def rows(self, seed: int) -> DataRows:
        """The split for ``seed``, loaded on first use (rollout workers only score)."""
        if seed not in self._rows:
            self._rows[seed] = split(load_rows(self.config), self.config.eval_fraction, seed)
        return self._rows[seed]

    def check(self, seed: int, groups_needed: int) -> None:
        """Load the data now (a ``TaskDataError`` names row and field) and check the epochs
        allowed hold the groups the run will ask for."""
        n = len(self.rows(seed).train)
        if self.config.epochs and groups_needed > self.config.epochs * n:
            raise TaskDataError(f"task.epochs: the run asks for {groups_needed} prompts but {self.config.epochs} "
                                f"epoch(s) of {n} training rows hold {self.config.epochs * n}")

    def _task(self, row, label: str) -> Task:
        return Task(prompt_text=f"Q:{row.prompt}\n", answer=row.answer, expression=f"{label}",
                    max_turns=self.max_turns(), messages=self.messages(row.prompt),
                    meta={"row": row.record, "where": label})

    def task_at(self, index: int, seed: int) -> Task:
        data = self.rows(seed)
        n = len(data.train)
        epoch = index // n
        if self.config.epochs and epoch >= self.config.epochs:
            raise TaskDataError(f"task.epochs: prompt {index + 1} is past {self.config.epochs} epoch(s) of {n} rows")
        row = data.train[epoch_order(n, epoch, seed, self.config.shuffle)[index % n]]
        return self._task(row, row.where)

    def eval_tasks(self, seed: int, limit: int) -> list[Task]:
        """The held-out rows (``task.eval_fraction``), at most ``limit`` of them."""
        return [self._task(r, r.where) for r in self.rows(seed).eval[:limit]]

    def sample_task(self, rng: random.Random) -> Task:
        return self.task_at(rng.randrange(2**31), rng.randrange(2**31))

    def score(self, task: Task, answer: str) -> tuple[float, str | None]:
        where = task.meta["where"] if task.meta else task.expression
        try:
            if task.answer is None:
                raise RewardError(f"task.path: {where}: field {self.config.answer_field!r} (task.answer_field) is missing")
            # the built-in checkers compare the answer itself: the text in <answer> tags when there are some
            text = answer_text(answer) if self.config.reward in ("exact-match", "math-verify") else answer
            return checked_score(self.reward_fn, self.config.reward, text, task.answer, task.meta["row"], where,
                                 self.config.reward_timeout_s), None
        except RewardError as err:
            if self.config.on_bad_data == "error":
                raise
            return 0.0, str(err)

    def reward(self, task: Task, final_text: str) -> float:
        return self.score(task, final_text)[0]


class ReasoningGymEnv(TagTurns):
    """``reasoning-gym``: a weighted mix of reasoning-gym datasets, scored by their verifiers."""

    name = "reasoning-gym"
    pure_history = True  # generated from the seed, scored by the generator

    def __init__(self, config: TaskConfig):
        self.config = config
        from reasoning_gym.factory import DATASETS

        for i, spec in enumerate(config.datasets):
            if spec.name not in DATASETS:
                raise ValueError(f"task.datasets[{i}].name: unknown reasoning-gym dataset {spec.name!r}")
        self._built: dict[int, object] = {}

    def dataset(self, seed: int):
        """The composite dataset generated from ``seed`` (items are made on access)."""
        if seed not in self._built:
            from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

            specs = [DatasetSpec(name=d.name, weight=d.weight, config=dict(d.config)) for d in self.config.datasets]
            try:
                self._built[seed] = CompositeDataset(CompositeConfig(size=self.config.size, seed=seed, datasets=specs))
            except Exception as err:  # a generator's own failure on its options: one line, no traceback
                reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
                raise ValueError(f"task.datasets: reasoning-gym rejected the datasets' config: "
                                 f"{type(err).__name__}{': ' + reason if reason else ''}") from None
        return self._built[seed]

    def check(self, seed: int, groups_needed: int) -> None:
        try:
            self.dataset(seed)[0]
        except ValueError:
            raise
        except Exception as err:  # the first item: a generator that fails on its options fails here, in one line
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ValueError(f"task.datasets: generating the first item failed: "
                             f"{type(err).__name__}{': ' + reason if reason else ''}") from None

    @cached_property
    def _system(self) -> str:
        from reasoning_gym.utils import SYSTEM_PROMPTS

        return self.config.system_prompt or SYSTEM_PROMPTS["default"]

    def _task(self, seed: int, index: int) -> Task:
        entry = self.dataset(seed)[index % self.config.size]
        messages = [{"role": "system", "content": self._system}, {"role": "user", "content": entry["question"]}]
        source = entry["metadata"]["source_dataset"]
        return Task(prompt_text=f"Q:{entry['question']}\n", answer=entry["answer"],
                    expression=f"{source} #{entry['metadata']['source_index']}", max_turns=self.max_turns(),
                    messages=messages, meta={"entry": entry, "seed": seed})

    def task_at(self, index: int, seed: int) -> Task:
        return self._task(seed, index)

    def eval_tasks(self, seed: int, limit: int) -> list[Task]:
        """``limit`` items generated from another seed than the training items."""
        return [self._task(seed + EVAL_SEED_OFFSET, i) for i in range(limit)]

    def sample_task(self, rng: random.Random) -> Task:
        return self._task(rng.randrange(2**31), rng.randrange(self.config.size))

    def score(self, task: Task, answer: str) -> tuple[float, str | None]:
        entry = task.meta["entry"]
        try:
            value = self.dataset(task.meta["seed"]).score_answer(answer_text(answer), entry)
        except Exception as err:  # a verifier failing on odd output: a counted zero or the run's error
            message = f"task.datasets: {entry['metadata']['source_dataset']} verifier raised {type(err).__name__}: {err}"
            if self.config.on_bad_data == "error":
                raise RewardError(message) from None
            return 0.0, message
        return float(value), None

    def reward(self, task: Task, final_text: str) -> float:
        return self.score(task, final_text)[0]
