"""Every knob of a run, as pydantic models: one schema for the CLI, the API and the forms.

Unknown fields are errors (``extra="forbid"``) so a typo never silently falls back to a
default. ``load_config`` turns a YAML/JSON file or a dict into a ``RunConfig`` and raises
``ConfigError`` whose message names the field and the reason.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from learner.cluster_config import ClusterConfig
from learner.placement import PlacementConfig, placement_problem
from learner.registries import engines, objectives, schedules
from learner.registries.engines import learner_engine, process_count, rollout_engine
from learner.registries.objectives import objective
from learner.registries.schedules import ON_POLICY, schedule_kind
from learner.safe_yaml import UnsafeYamlError, load_yaml

Schedule = Literal[schedules.NAMES]
SCHEDULES: tuple[str, ...] = schedules.NAMES
LossAggMode = Literal[objectives.ALL_LOSS_AGG_MODES]
LOSS_AGG_MODES: tuple[str, ...] = objectives.ALL_LOSS_AGG_MODES
StdMode = Literal["unbiased", "population", "none"]
STD_MODES: tuple[str, ...] = ("unbiased", "population", "none")
NODE_NAME = r"^[a-z0-9][a-z0-9_-]{0,31}$"  # a node name, also a Celery queue suffix (runs.<node>)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraSettings(Strict):
    """LoRA adapters on the policy (learner.lora): only they train; engines get merged weights."""

    rank: int = Field(8, ge=1, le=1024)
    alpha: float = Field(16.0, gt=0.0, le=1e6, description="scale alpha/rank on B·A")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1, max_length=64,
        description="names of the Linear modules that get adapters")


class ModelConfig(Strict):
    # server_path: the controller reads these only from its model roots (controller/server_paths.py)
    policy: str = Field("builtin:tiny", description="'builtin:tiny' or a local Hugging Face model directory",
                        json_schema_extra={"server_path": "model"})
    teacher: str = Field("builtin:teacher", description="OPD teacher: 'builtin:teacher' or a local HF directory",
                         json_schema_extra={"server_path": "model"})
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="where the learner trains and the torch engine and teacher run (cuda: the node's first "
                           "GPU, or each process's own as placement says)")
    cache_dir: str | None = Field(None, description="where built-in models are cached (default ~/.cache/thundersync)",
                                  json_schema_extra={"server_path": "run"})
    builtin_seed: int = Field(
        0, ge=0, le=2**31 - 1,
        description="which build of a built-in model: 0 is shipped with the package (the same weights on every "
                    "machine); another seed is trained on first use (about a minute of CPU) and may differ in the "
                    "last bits between processors. The run's own seed does not change the model")
    lora: LoraSettings | None = Field(None, description="train LoRA adapters instead of all weights (docs/tasks.md)")


class ToolLatency(Strict):
    """A labelled *model* of agent tool latency (real tools answer in microseconds here).

    The calculator's answer is computed for real; this only adds waiting time drawn from
    the distribution, so users can set the rollout/learner balance like a real agent's.
    """

    distribution: Literal["lognormal", "pareto", "constant", "none"] = "lognormal"
    median_s: float = Field(0.05, ge=0.0, le=600.0)
    sigma: float = Field(0.8, ge=0.0, le=5.0, description="lognormal shape; larger = longer tail")
    alpha: float = Field(1.5, gt=1.0, le=20.0,
                         description="pareto tail index: P(wait > x) ~ x^-alpha; nearer 1 = heavier tail")
    max_s: float | None = Field(None, gt=0.0, le=3600.0,
                                description="every draw is cut to this before scale (a harness's timeout)")
    scale: float = Field(1.0, ge=0.0, le=1000.0, description="multiplies every draw (the bench's --balance)")


class GymDataset(Strict):
    """One reasoning-gym dataset of a ``reasoning-gym`` task (docs/tasks.md)."""

    name: str = Field(..., min_length=1, max_length=100, description="a reasoning_gym dataset name, e.g. basic_arithmetic")
    weight: float = Field(1.0, gt=0.0, le=1e6)
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own options")


class TaskConfig(Strict):
    name: str = Field("arith-tool", min_length=1, max_length=100,
                      description="a registered environment (learner.tasks.registry.register_env)")
    min_ops: int = Field(1, ge=1, le=4)
    max_ops: int = Field(2, ge=1, le=4)
    max_operand: int = Field(20, ge=2, le=999)
    max_turns: int = Field(4, ge=1, le=16)
    tool_latency: ToolLatency = Field(default_factory=ToolLatency)
    tool_timeout_s: float = Field(60.0, gt=0.0, le=3600.0,
                                  description="a tool call still running after this is abandoned; its observation says so")
    prompt_preamble: str | None = Field(
        None, min_length=1, max_length=20_000,
        description="arith-tool: text every prompt starts with, in the first user turn (a long tool description or "
                    "system prompt, the same for every member of a group); data tasks: task.system_prompt")
    # tasks from data (task.name: dataset; docs/tasks.md)
    path: str | None = Field(None, max_length=4096,
                             description="JSONL/Parquet/CSV file or a `datasets` save_to_disk directory")
    format: Literal["auto", "jsonl", "parquet", "csv", "hf-disk"] = "auto"
    prompt_field: str = Field("prompt", min_length=1, max_length=200)
    answer_field: str = Field("answer", min_length=1, max_length=200)
    system_prompt: str | None = Field(None, max_length=20_000, description="a system message before each prompt")
    reward: str = Field("exact-match", min_length=1, max_length=500,
                        description="math-verify | exact-match | regex | 'file.py:function' | 'module:function'")
    reward_pattern: str | None = Field(None, max_length=1000, description="regex reward: group 1 is the answer")
    reward_timeout_s: float = Field(30.0, gt=0.0, le=3600.0,
                                    description="a reward function still running after this fails its trajectory "
                                                "(task.on_bad_data decides: the run fails, or it scores 0)")
    on_bad_data: Literal["error", "score-zero"] = Field(
        "error", description="bad row or failing reward: stop with an error naming row and field, or score 0 and count it")
    shuffle: bool = Field(True, description="reshuffle the training rows each epoch, from the run seed")
    epochs: int = Field(0, ge=0, le=1_000_000, description="passes over the training rows allowed (0: no limit)")
    eval_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of rows held out for train.eval_every")
    tools: list[Literal["calculator", "python-sandbox"]] = Field(
        default_factory=list, max_length=1, description="the tool the policy may call (at most one)")
    tool_format: Literal["auto", "tags", "hermes"] = Field(
        "auto", description="how turns call tools: <call> tags (built-in) or <tool_call> JSON (Qwen/Hermes)")
    # reasoning-gym (task.name: reasoning-gym)
    datasets: list[GymDataset] = Field(default_factory=list, max_length=100)
    size: int = Field(10_000, ge=1, le=10_000_000, description="reasoning-gym items generated per split")

    @model_validator(mode="after")
    def _ops_ordered(self) -> "TaskConfig":
        if self.min_ops > self.max_ops:
            raise ValueError("min_ops must be <= max_ops")
        if self.name == "arith-tool" and self.max_turns < self.max_ops + 1:
            # n operators need n single-operation calls plus the answer turn
            raise ValueError(f"max_turns must be >= max_ops + 1 = {self.max_ops + 1} so arith-tool tasks are solvable")
        return self

    @model_validator(mode="after")
    def _data_task_complete(self) -> "TaskConfig":
        if self.name == "dataset" and not self.path:
            raise ValueError("path: a dataset task needs task.path (a JSONL/Parquet/CSV file or a datasets directory)")
        if self.name == "reasoning-gym" and not self.datasets:
            raise ValueError("datasets: a reasoning-gym task needs at least one dataset (name and weight)")
        if self.reward == "regex" and not self.reward_pattern:
            raise ValueError("reward_pattern: reward 'regex' needs a pattern whose group 1 is the answer")
        return self

    @model_validator(mode="after")
    def _gym_options_allowed(self) -> "TaskConfig":
        # a generator's options may open files and cost exponential work: learner/gym_options.py
        if self.datasets:
            from learner.gym_options import task_problem

            if problem := task_problem([d.model_dump() for d in self.datasets]):
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _preamble_is_arith_tool(self) -> "TaskConfig":
        if self.prompt_preamble is not None and self.name != "arith-tool":
            raise ValueError(f"task.prompt_preamble: arith-tool only; task {self.name} has task.system_prompt")
        return self


class SpeculationConfig(Strict):
    """Cross-iteration speculation (docs/speculation.md): while step k learns, the fleet drafts
    step k+1's trajectories under the weights it has; each draft is verified exactly against
    step k+1's weights once they are published, and only the rejected remainder is sampled."""

    enabled: bool = Field(False, description="draft the next steps' trajectories and verify them exactly")
    lookahead: int = Field(1, ge=1, le=4, description="how many steps ahead the fleet drafts "
                           "(1 measures best on the bench workload: docs/speculation.md, Lookahead)")
    draft_token_budget: int = Field(
        65_536, ge=1, le=100_000_000, description="per worker: the drafts' contexts hold at most this many "
        "tokens (a draft's next turn waits while they exceed it), bounding draft memory")
    reuse_verified_kv: bool = Field(
        True, description="with rollout.reuse_kv: a rejected draft's remainder (and an unfinished draft kept "
        "whole) starts from the verification forward's keys/values instead of prefilling its context again; "
        "they count against draft_token_budget (false only to measure what it saves)")
    gate: Literal["cost", "always"] = Field(
        "cost", description="cost: draft a batch only where the measured kept share, decode and verify costs say it "
        "saves engine time (re-probing now and then, docs/speculation.md, 'When drafting pays'); always: every batch")


class RolloutConfig(Strict):
    engine: Literal[engines.ROLLOUT_ENGINE_NAMES] = "torch"
    workers: int = Field(1, ge=1, le=64, description="rollout worker processes (torch engine)")
    replicas: int = Field(1, ge=1, le=64, description="engine replicas (vLLM)")
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(24, ge=1, le=4096, description="per turn")
    continuous_batching: bool = Field(
        True, description="torch engine: a loop that becomes ready mid-call joins the running generate call "
        "and a finished row leaves it (false: one fixed batch per call)")
    reuse_kv: bool = Field(
        True, description="torch engine with continuous batching: an agent loop's next turn starts from the "
        "keys/values of its last turn (only the new tokens are prefilled) instead of its whole context")
    max_running_rows: int | None = Field(
        None, ge=1, le=1_000_000, description="torch engine with continuous batching: at most this many rows "
        "decode at once, loops in later turns first, so rewards and group closes spread over the rollout "
        "(null: every ready loop; docs/architecture.md)")
    captured_decode: bool = Field(
        False, description="torch engine with continuous_batching false: a static KV cache and, on CUDA, the decode "
        "step captured once per generate call as a CUDA graph (one launch per token); the same tokens as eager "
        "(docs/gpu.md)")
    dtype: Literal["float32", "float64", "bfloat16"] | None = Field(
        None, description="the rollout engine's weights (torch engine, vLLM: float32 or bfloat16); null: model.dtype. "
                          "bfloat16 beside a float32 learner samples at bf16 precision: the same-version log-prob "
                          "check then reports the mismatch without failing the run (docs/gpu.md)")
    pin_cores: bool = Field(True, description="pin learner and each worker to its own core where possible")
    on_every_node: bool = Field(
        True, description="with learner.nodes: every node runs these workers (replicas), each group sampled on "
        "the node of the rank that learns it (docs/distributed-nodes.md); false: the first node samples everything")
    receive_timeout_s: float = Field(600.0, gt=0.0, le=86_400.0,
                                     description="the run fails when the fleet sends nothing for this long")
    max_worker_restarts: int = Field(
        2, ge=0, le=100, description="a rollout worker that dies is respawned and its trajectories sampled "
        "again, this many times per step; one failure more fails the run")
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)

    @model_validator(mode="after")
    def _speculation_needs_keyed_engine(self) -> "RolloutConfig":
        if not self.speculation.enabled:
            return self
        # vLLM samples keyed too (rollout/vllm_backend/vllm_keyed.py) and batches continuously itself; its size
        # limit (the vocabulary verification reads whole) is checked when the engine starts
        if rollout_engine(self.engine).in_process_batching and not self.continuous_batching:
            raise ValueError("rollout.speculation: needs continuous_batching true (drafts yield to the current "
                             "step's rows between decode steps)")
        return self

    @model_validator(mode="after")
    def _captured_decode_fits(self) -> "RolloutConfig":
        if self.captured_decode and (not rollout_engine(self.engine).in_process_batching or self.continuous_batching):
            raise ValueError("rollout.captured_decode: decodes a fixed batch per call on the torch engine; it needs "
                             "engine: torch and continuous_batching: false")
        return self

    @model_validator(mode="after")
    def _cap_needs_continuous_batching(self) -> "RolloutConfig":
        if self.max_running_rows is not None and (not rollout_engine(self.engine).in_process_batching
                                                  or not self.continuous_batching):
            raise ValueError("max_running_rows: caps the torch engine's continuous batching; it needs engine: torch "
                             "and continuous_batching: true (vLLM has its own max_num_seqs)")
        return self


class AdvantageConfig(Strict):
    std: StdMode = "unbiased"
    eps: float = Field(1e-6, ge=0.0, le=1.0)


class AlgorithmConfig(Strict):
    objective: Literal[objectives.NAMES] = "grpo"
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
    eval_every: int = Field(0, ge=0, le=1_000_000, description="evaluate on held-out prompts every N steps (0: never)")
    eval_mode: Literal["greedy", "pass@k"] = "greedy"
    eval_k: int = Field(4, ge=1, le=256, description="samples per prompt for pass@k")
    eval_prompts: int = Field(32, ge=1, le=100_000, description="held-out prompts evaluated (at most)")
    output_dir: str | None = Field(None, max_length=4096,
                                   description="save the final policy here (LoRA: the adapter and merged/)")
    checkpoint_every: int = Field(0, ge=0, le=1_000_000,
                                  description="checkpoint every N steps and at the end, under output_dir/checkpoints/ (0: never)")
    keep_checkpoints: int = Field(3, ge=1, le=1000, description="checkpoints kept (the newest)")
    micro_batch_tokens: int = Field(
        4096, ge=1, le=10_000_000,
        description="padded tokens (rows x longest row) per learner micro-batch (docs/learner.md)")


LEARNER_ENGINES: tuple[str, ...] = engines.LEARNER_ENGINE_NAMES
LEARNER_PATHS: tuple[str, ...] = ("per-trajectory", "micro-batched", "adaptive")
LearnerPath = Literal[("auto", *LEARNER_PATHS)]
DRAIN_POLICIES: tuple[str, ...] = ("cost-aware", "finished-groups-first", "closed-groups")
# The best learner of each schedule, what ``learner.path: auto`` picks (docs/learner.md).
BEST_LEARNER_PATH: dict[str, str] = {k.name: k.best_learner_path for k in schedules.SCHEDULE_KINDS.values()}


class LearnerConfig(Strict):
    """How the learner computes a batch's gradient (docs/learner.md); every path is exact."""

    path: LearnerPath = Field(
        "auto", description="auto: micro-batched for sync/async/fully-async, adaptive for streaming; "
                            "per-trajectory: one forward+backward per trajectory (the earlier learner)")
    max_open_groups: int | None = Field(
        None, ge=0, le=1_000_000,
        description="K: most groups holding running sums at once (null: unlimited); a member of a group "
                    "without sums waits and is learnt with its final advantage when the group closes")
    deterministic: bool | None = Field(
        None, description="streaming: learn each group at its close into a fixed-point sum, so that the weights "
                           "are a function of the data alone (bit-identical run to run and across a resume); "
                           "null: on when train.checkpoint_every is set and learner.path is auto "
                           "(docs/learner.md); the other schedules are deterministic either way")
    accumulator_device: Literal["device", "host"] = Field(
        "device", description="where open groups' sums live: beside the model, or in host memory "
                              "(page-locked when the model is on a GPU)")
    speculate_zero_variance: bool | None = Field(
        None, description="adaptive learner: learn members of a group whose rewards so far are all equal "
                          "when nothing else waits (false: they wait for a second reward or the close, so "
                          "no backward is spent on a group that ends zero-variance); null: on exactly when "
                          "the loss has a KL or entropy term, which those members need learnt anyway")
    drain_policy: Literal[DRAIN_POLICIES] = Field(
        "cost-aware", description="adaptive learner: when work the micro-batched sync would not do runs before "
                                  "the groups close (open groups' buckets, unfilled micro-batches): cost-aware: "
                                  "an unfilled micro-batch only in place of sync's own, an open bucket only when "
                                  "its measured premium is below the tail it saves, fits in early_work_share, the "
                                  "rollout is near its end and the bucket ends before it; finished-groups-first: whenever the learner would idle; closed-groups: "
                                  "never (docs/learner-drain.md)")
    early_work_share: float = Field(
        0.05, ge=0.0, le=10.0, description="cost-aware: early work's measured premium per batch, at most this "
                                           "share of the batch's estimated micro-batched learner work")
    grouped_backward: bool = Field(
        True, description="adaptive learner: a micro-batch may mix open groups' (group, reward) buckets and known "
                          "rows, one forward and one backward, each parameter's gradient reduced per bucket inside "
                          "it (docs/learner-drain.md); false: one micro-batch per open bucket")
    pack_rows: bool = Field(
        True, description="pack several rows into each line of a learner micro-batch (position ids restarting "
                          "per row, attention causal within a row) instead of right-padding every row to the "
                          "longest (docs/learner.md); false: one right-padded row per line")
    shared_prompt_backward: bool = Field(
        False, description="sync and streaming GRPO: forward a group's shared prompt once, let each member's "
                           "completion attend to its keys/values, and back-propagate the prompt once when every "
                           "member is learnt (docs/learner.md); exact either way, with model.lora and on "
                           "data-parallel ranks too (a group is learnt on its owner rank)")
    shared_prompt_max_tokens: int = Field(
        32768, ge=1, le=10_000_000, description="shared-prompt backward: most prompt tokens whose activations are "
                                                "kept at once; a group beyond it is learnt the ordinary way")
    # data parallel (docs/distributed.md)
    world_size: int = Field(1, ge=1, le=62, description="learner ranks (processes; one per GPU, one core each on CPU); "
                                                        "every member of a group is learnt on its owner rank")
    engine: Literal[engines.LEARNER_ENGINE_NAMES] = Field(
        "torch", description="gradient reduction + optimizer: torch.distributed (float64 too) or DeepSpeed ZeRO (float32)")
    zero_stage: Literal[0, 1, 2] = Field(0, description="DeepSpeed ZeRO stage (engine deepspeed); 3 is not supported")
    offload_optimizer: bool = Field(False, description="DeepSpeed: optimizer state in host memory (zero_stage 1 or 2)")
    timeout_s: float = Field(120.0, gt=0.0, le=86_400.0,
                             description="longest wait of a rank for its peers (rendezvous, barrier, reduction)")
    digest_every: int = Field(
        50, ge=1, le=1_000_000,
        description="data-parallel ranks compare a SHA-256 of their weights after the first step and every "
                    "this many steps, an on-device checksum after the others (docs/gpu.md)")
    nodes: list[Annotated[str, StringConstraints(pattern=NODE_NAME)]] | None = Field(
        None, min_length=1, max_length=16,
        description="nodes the ranks run on, world_size / len(nodes) each, in rank order; the first runs rank 0, "
                    "the driver and the rollout fleet; the controller starts the others on queue runs.<node>")

    @model_validator(mode="after")
    def _nodes_fit(self) -> "LearnerConfig":
        nodes = self.nodes
        if nodes is None:
            return self
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"learner.nodes: each node once, got {nodes}")
        if self.world_size % len(nodes):
            raise ValueError(f"learner.nodes: {len(nodes)} nodes for learner.world_size {self.world_size}; every node "
                             "runs world_size / len(nodes) ranks, so world_size must be a multiple of the node count")
        return self

    def node_of(self, rank: int) -> str | None:
        """The node that runs ``rank`` (None: a run on one node)."""
        if not self.nodes:
            return None
        return self.nodes[rank // (self.world_size // len(self.nodes))]


class TrackingConfig(Strict):
    """Step metrics also written for TensorBoard / W&B (learner/tracking.py), and how often the
    run's processes are sampled (learner/driver/system_metrics.py)."""

    tensorboard: str | None = Field(
        None, max_length=500, description="directory for TensorBoard event files (relative: to the working directory)")
    wandb: bool = Field(False, description="log to Weights & Biases in offline mode (needs the wandb package)")
    system_every_s: float = Field(
        2.0, ge=0.0, le=3600.0,
        description="seconds between samples of every process's CPU %, RSS (and GPU) as system events; 0: only at step ends")

    @model_validator(mode="after")
    def _sampling_not_a_busy_loop(self) -> "TrackingConfig":
        if 0 < self.system_every_s < 0.1:
            raise ValueError("system_every_s must be 0 (only at step ends) or at least 0.1 s")
        return self


class RunConfig(Strict):
    name: str = Field("run", min_length=1, max_length=200)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    placement: PlacementConfig | None = Field(
        None, description="GPU of each learner rank, rollout worker and the teacher (docs/gpu.md); null: model.device")
    cluster: ClusterConfig | None = Field(
        None, description="place the run's roles on a Ray cluster (docs/distributed-nodes.md, \"Running on a cluster\"); "
                          "null: this machine only, Ray is never imported")

    def ranks_per_node(self) -> int:
        """Learner ranks on each node: world_size / cluster.nodes (or / len(learner.nodes))."""
        nodes = self.cluster.nodes if self.cluster is not None else len(self.learner.nodes or [None])
        return self.learner.world_size // nodes

    def learner_ranks(self) -> bool:
        """Does the learner run as ranks (world_size > 1, or an engine that is not in-process torch)?"""
        return self.learner.world_size > 1 or not learner_engine(self.learner.engine).in_process

    def learner_path(self) -> str:
        """The learner path this run trains with (``learner.path``, ``auto`` resolved)."""
        path = self.learner.path
        return BEST_LEARNER_PATH[self.train.schedule] if path == "auto" else path

    def speculate_zero_variance(self) -> bool:
        """``learner.speculate_zero_variance``, null resolved: with a KL or entropy term a zero-variance
        candidate's backward is never wasted (that term does not depend on the advantage and the
        open-group bucket learns it in the same pass), so the learner need not wait for its close."""
        wanted = self.learner.speculate_zero_variance
        if wanted is None:
            return self.algorithm.kl_coef > 0 or self.algorithm.entropy_coef > 0
        return wanted

    def deterministic_learner(self) -> bool:
        """Does streaming learn with the deterministic learner (``learner.deterministic``, null resolved)?"""
        wanted = self.learner.deterministic
        if wanted is None:  # data-parallel ranks have none: they checkpoint with the streaming learner
            wanted = (bool(self.train.checkpoint_every) and self.learner.path == "auto"
                      and not self.learner_ranks())
        return wanted and schedule_kind(self.train.schedule).learns_on_arrival

    @model_validator(mode="after")
    def _deterministic_fits(self) -> "RunConfig":
        if self.learner.deterministic and schedule_kind(self.train.schedule).learns_on_arrival:
            if self.learner.path != "auto":
                raise ValueError(f"learner.deterministic: streaming's deterministic learner batches its own way; "
                                 f"learner.path {self.learner.path} depends on arrival order (leave it auto)")
            if self.learner_ranks():
                raise ValueError("learner.deterministic: data-parallel ranks (learner.world_size > 1, engine "
                                 "deepspeed) have no deterministic streaming learner")
        return self

    @model_validator(mode="after")
    def _learner_path_fits_schedule(self) -> "RunConfig":
        path, schedule = self.learner.path, self.train.schedule
        streams = schedule_kind(schedule).learns_on_arrival
        if path == "adaptive" and not streams:
            raise ValueError(f"learner.path: adaptive streams trajectories as they arrive; {schedule} hands "
                             "the learner whole batches (use micro-batched or per-trajectory)")
        if path == "micro-batched" and streams:
            raise ValueError("learner.path: streaming learns open groups as they arrive; use adaptive "
                             "(micro-batched drains when work queues) or per-trajectory")
        return self

    @model_validator(mode="after")
    def _data_parallel_fits(self) -> "RunConfig":
        lrn = self.learner
        kind = learner_engine(lrn.engine)
        if self.model.dtype not in kind.dtypes:
            raise ValueError(f"learner.engine: {lrn.engine} trains {', '.join(kind.dtypes)} here, model.dtype is "
                             f"{self.model.dtype} (float64 runs on learner.engine torch)")
        if lrn.offload_optimizer and (not kind.offloads_optimizer or lrn.zero_stage == 0):
            raise ValueError("learner.offload_optimizer: needs learner.engine deepspeed with zero_stage 1 or 2")
        if not kind.checkpoints_optimizer and self.train.checkpoint_every:
            raise ValueError("train.checkpoint_every: learner.engine deepspeed keeps the optimizer state inside "
                             "DeepSpeed (partitioned over the ranks under ZeRO 1/2), which checkpoints do not hold; "
                             "data-parallel runs checkpoint with learner.engine torch")
        if self.learner_ranks() and self.model.lora is not None:
            raise ValueError("learner.world_size: data-parallel ranks train all weights; model.lora is not supported there")
        if self.learner_ranks() and self.train.schedule not in ON_POLICY:
            raise ValueError(f"learner.world_size: data-parallel ranks train the on-policy schedules (sync, "
                             f"streaming), not {self.train.schedule}")
        return self

    @model_validator(mode="after")
    def _shared_prompt_fits(self) -> "RunConfig":
        if not self.learner.shared_prompt_backward:
            return self
        refused = None
        if self.train.schedule not in ON_POLICY:
            refused = f"the on-policy schedules (sync, streaming), not {self.train.schedule}"
        elif not objective(self.algorithm.objective).group_advantage:
            refused = "GRPO, not objective opd (OPD learns turn by turn)"
        elif self.deterministic_learner():
            refused = "the streaming learner, not learner.deterministic (its fixed-point sum is per micro-batch)"
        if refused:
            raise ValueError(f"learner.shared_prompt_backward: supported for {refused}")
        return self

    @model_validator(mode="after")
    def _speculation_is_on_policy(self) -> "RunConfig":
        if self.rollout.speculation.enabled and self.train.schedule not in ON_POLICY:
            raise ValueError(f"rollout.speculation: drafts are verified against the next step's weights, which "
                             f"sync and streaming wait for; {self.train.schedule} samples ahead with older "
                             "weights already (turn speculation off)")
        if self.rollout.speculation.enabled and self.learner.nodes:
            raise ValueError("rollout.speculation: runs that span nodes (learner.nodes) place each group on a node's "
                             "fleet by its rank; drafts are placed on one fleet's workers only (turn speculation off)")
        return self

    @model_validator(mode="after")
    def _cluster_fits(self) -> "RunConfig":
        if self.cluster is None:
            return self
        if self.learner.nodes:
            raise ValueError("learner.nodes: a run on a Ray cluster is placed by cluster.nodes (Ray picks the nodes); "
                             "leave learner.nodes out")
        if self.learner.world_size % self.cluster.nodes:
            raise ValueError(f"cluster.nodes: {self.cluster.nodes} nodes for learner.world_size "
                             f"{self.learner.world_size}; every node runs world_size / nodes ranks")
        return self

    @model_validator(mode="after")
    def _placement_fits(self) -> "RunConfig":
        if self.placement is not None:
            workers = process_count(self.rollout)
            # on a cluster the placement is resources to reserve (Ray assigns the GPUs); model.device cpu
            # there computes on the CPUs of the reserved bundles (a test cluster with GPUs as resources)
            device = "cuda" if self.cluster is not None else self.model.device
            problem = placement_problem(self.placement, self.ranks_per_node(), workers, device,
                                        objective(self.algorithm.objective).teacher_scored, self.rollout.engine)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _loss_agg_mode_fits_objective(self) -> "RunConfig":
        # 1/|o_i| is unknown until the last turn is scored, so a turn's backward cannot apply it
        algo = self.algorithm
        if algo.loss_agg_mode not in objective(algo.objective).loss_agg_modes:
            raise ValueError(f"algorithm.loss_agg_mode: {algo.loss_agg_mode} is not available for {algo.objective} "
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
        raw = p.read_bytes()
    except OSError as err:
        raise ConfigError(f"config: cannot read {p}: {err.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config: {p} is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})") from None
    try:
        data = load_yaml(text)
    except UnsafeYamlError as err:
        raise ConfigError(f"config: {p}: {err}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
    check_overridden_fields(data, overrides or {})
    return parse_config(apply_overrides(data, overrides or {}))


def check_overridden_fields(data: dict, overrides: dict[str, Any]) -> None:
    """A field the command line overrides must still be valid in the file: a bad
    ``train.steps`` is an error even when ``--steps`` replaces it (the file is what the
    next run without the flag, or the controller, reads)."""
    try:
        RunConfig.model_validate(data)
    except ValidationError as err:
        bad = [e for e in err.errors() if ".".join(str(x) for x in e["loc"]) in overrides]
        if bad:
            raise ConfigError(describe_validation_error(ValidationError.from_exception_data(err.title, bad))) from None
