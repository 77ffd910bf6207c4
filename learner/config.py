"""Every knob of a run, as pydantic models: one schema for the CLI, the API and the forms.

Unknown fields are errors (``extra="forbid"``) so a typo never silently falls back to a
default. ``load_config`` turns a YAML/JSON file or a dict into a ``RunConfig`` and raises
``ConfigError`` whose message names the field and the reason.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Schedule = Literal["sync", "async", "fully-async", "streaming"]
SCHEDULES: tuple[str, ...] = ("sync", "async", "fully-async", "streaming")
LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
)
StdMode = Literal["unbiased", "population", "none"]
STD_MODES: tuple[str, ...] = ("unbiased", "population", "none")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelConfig(Strict):
    policy: str = Field("builtin:tiny", description="'builtin:tiny' or a local Hugging Face model directory")
    teacher: str = Field("builtin:teacher", description="OPD teacher: 'builtin:teacher' or a local HF directory")
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="where the learner trains and the torch engine and teacher run (cuda: the node's GPU)")
    cache_dir: str | None = Field(None, description="where built-in models are cached (default ~/.cache/thundersync)")


class ToolLatency(Strict):
    """A labelled *model* of agent tool latency (real tools answer in microseconds here).

    The calculator's answer is computed for real; this only adds waiting time drawn from
    the distribution, so users can set the rollout/learner balance like a real agent's.
    """

    distribution: Literal["lognormal", "constant", "none"] = "lognormal"
    median_s: float = Field(0.05, ge=0.0, le=600.0)
    sigma: float = Field(0.8, ge=0.0, le=5.0, description="lognormal shape; larger = longer tail")
    scale: float = Field(1.0, ge=0.0, le=1000.0, description="multiplies every draw (the bench's --balance)")


class TaskConfig(Strict):
    name: str = Field("arith-tool", min_length=1, max_length=100,
                      description="a registered environment (learner.rollout.env.register_env)")
    min_ops: int = Field(1, ge=1, le=4)
    max_ops: int = Field(2, ge=1, le=4)
    max_operand: int = Field(20, ge=2, le=999)
    max_turns: int = Field(4, ge=1, le=16)
    tool_latency: ToolLatency = Field(default_factory=ToolLatency)

    @model_validator(mode="after")
    def _ops_ordered(self) -> "TaskConfig":
        if self.min_ops > self.max_ops:
            raise ValueError("min_ops must be <= max_ops")
        if self.name == "arith-tool" and self.max_turns < self.max_ops + 1:
            # n operators need n single-operation calls plus the answer turn
            raise ValueError(f"max_turns must be >= max_ops + 1 = {self.max_ops + 1} so arith-tool tasks are solvable")
        return self


class RolloutConfig(Strict):
    engine: Literal["torch", "vllm"] = "torch"
    workers: int = Field(1, ge=1, le=64, description="rollout worker processes (torch engine)")
    replicas: int = Field(1, ge=1, le=64, description="engine replicas (vLLM)")
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(24, ge=1, le=4096, description="per turn")
    pin_cores: bool = Field(True, description="pin learner and each worker to its own core where possible")


class AdvantageConfig(Strict):
    std: StdMode = "unbiased"
    eps: float = Field(1e-6, ge=0.0, le=1.0)


class AlgorithmConfig(Strict):
    objective: Literal["grpo", "opd"] = "grpo"
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    loss_agg_mode: LossAggMode = "token-mean"
    loss_scale_constant: float = Field(
        256.0, gt=0.0, le=1e9, description="C of seq-mean-token-sum-norm"
    )
    kl_coef: float = Field(0.0, ge=0.0, le=100.0, description="k3 KL to the frozen initial policy")
    entropy_coef: float = Field(0.0, ge=0.0, le=100.0)
    clip_ratio: float = Field(0.2, gt=0.0, le=10.0, description="PPO clip for off-policy schedules")

    @model_validator(mode="before")
    @classmethod
    def _one_optimizer_step_per_batch(cls, data: Any) -> Any:
        # Every schedule takes exactly one optimizer step per batch (docs/math.md): several
        # PPO epochs or mini-batches are not implemented, so asking for them is an error
        # rather than a silent single pass. 1 (the old default, in stored configs) is what runs.
        if isinstance(data, dict) and ("ppo_epochs" in data or "mini_batches" in data):
            data = dict(data)
            for knob in ("ppo_epochs", "mini_batches"):
                if knob in data and data.pop(knob) != 1:
                    raise ValueError(f"algorithm.{knob}: every schedule takes exactly one optimizer step per "
                                     "batch; several epochs or mini-batches are not implemented (leave it out or set 1)")
        return data


class TrainConfig(Strict):
    schedule: Schedule = "streaming"
    steps: int = Field(1, ge=0, le=1_000_000)
    prompts_per_step: int = Field(4, ge=1, le=65_536)
    group_size: int = Field(4, ge=1, le=1024)
    lr: float = Field(1e-3, gt=0.0, le=10.0)
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    grad_clip: float = Field(1.0, ge=0.0, le=1e6, description="0 disables clipping")
    max_staleness: int = Field(2, ge=0, le=1000, description="fully-async bound")


class RunConfig(Strict):
    name: str = Field("run", min_length=1, max_length=200)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @model_validator(mode="after")
    def _opd_has_no_per_sequence_mean(self) -> "RunConfig":
        # 1/|o_i| is unknown until the last turn is scored, so a turn's backward cannot apply it
        if self.algorithm.objective == "opd" and self.algorithm.loss_agg_mode == "seq-mean-token-mean":
            raise ValueError("algorithm.loss_agg_mode: seq-mean-token-mean is not available for opd "
                             "(a turn's weight 1/|o_i| is unknown until the trajectory ends)")
        return self


class ConfigError(ValueError):
    """A config that does not validate; ``str()`` is one line naming field and reason."""


def describe_validation_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "config"
        msg = e["msg"].removeprefix("Value error, ")
        if msg.startswith(f"{loc}."):  # the message names the exact field itself
            loc, msg = msg.split(": ", 1)
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_config(data: Any) -> RunConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(describe_validation_error(err)) from None


def apply_overrides(data: dict, overrides: dict[str, Any]) -> dict:
    """A copy of ``data`` with each dotted path ('train.steps') set to its value."""
    merged = copy.deepcopy(data)
    for dotted, value in overrides.items():
        node = merged
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: cannot set a field inside a non-mapping")
        node[leaf] = value
    return merged


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read YAML/JSON at ``path``; ``overrides`` maps dotted names ('train.steps') to values."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"config: cannot read {p}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config: {p} is not valid YAML: {str(err).splitlines()[0]}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
    return parse_config(apply_overrides(data, overrides or {}))
