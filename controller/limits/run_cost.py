"""What a run costs, read from its validated config (as a dict, every default filled in):
the quotas bound these, not only counts (controller/limits/quotas.py, docs/controller-api.md "Security
and fair use")."""

from collections.abc import Iterator
from dataclasses import dataclass

from learner.registries.engines import process_count, rollout_engine

# A reasoning-gym dataset's own options that are not sizes of one generated item: its seed,
# and how many items (bounded by the task_size quota, as task.size is).
NOT_A_SIZE = {"seed", "size"}


@dataclass(frozen=True)
class Cost:
    value: int
    inputs: tuple[str, ...]  # the config paths it is computed from (a refusal names them)
    formula: str  # how, in words


def processes(config: dict) -> Cost:
    """Processes the run starts: its rollout processes (``rollout.workers`` for the torch
    engine, ``rollout.replicas`` for vLLM; on every node of ``learner.nodes`` when
    ``rollout.on_every_node``) and its learner ranks (``learner.world_size``)."""
    rollout, learner = config["rollout"], config["learner"]
    field = rollout_engine(rollout["engine"]).processes_field
    per_node = process_count(rollout)
    nodes = len(learner.get("nodes") or []) if rollout.get("on_every_node", True) else 0
    fleets = max(nodes, 1)
    value = per_node * fleets + learner["world_size"]
    where = f" × {fleets} nodes" if fleets > 1 else ""
    return Cost(value, (field, "learner.world_size"),
                f"{field}{where} + learner.world_size = {per_node}{where} + {learner['world_size']} = {value} processes")


def gpus(config: dict) -> Cost:
    """GPUs the run holds: none on ``model.device: cpu``; with ``placement``, the distinct GPU
    indices it names on a node (learner ranks, rollout GPUs, the teacher's) on each of its nodes
    (``cluster.nodes``, or ``learner.nodes``); on CUDA without placement, one per learner rank
    (the rollout engines share them)."""
    model, learner, placement = config["model"], config["learner"], config.get("placement")
    cluster = config.get("cluster") or {}
    nodes = cluster.get("nodes") or len(learner.get("nodes") or []) or 1
    if not str(model.get("device", "cpu")).startswith("cuda"):
        return Cost(0, ("model.device",), f"model.device {model.get('device', 'cpu')}: 0 GPUs")
    if not placement:
        value = learner["world_size"]
        return Cost(value, ("learner.world_size",), f"learner.world_size = {value} GPUs (one per rank)")
    ids = {*placement["learner"], *placement["rollout"]}
    if placement.get("teacher") is not None:
        ids.add(placement["teacher"])
    value = len(ids) * nodes
    where = f" × {nodes} nodes" if nodes > 1 else ""
    return Cost(value, ("placement.learner", "placement.rollout", "placement.teacher"),
                f"the GPUs placement names on a node{where} = {len(ids)}{where} = {value} GPUs")


def prompt_chars(task: dict) -> int:
    """What the config itself adds to every prompt (a preamble, a system prompt); a character
    is at most one token for every tokenizer the project uses (the built-ins tokenize by
    character; subword tokenizers merge characters)."""
    return len(task.get("prompt_preamble") or "") + len(task.get("system_prompt") or "")


def tokens_per_step(config: dict) -> Cost:
    """An upper bound of the tokens a step samples and learns: trajectories × (the prompt the
    config writes + ``rollout.max_new_tokens`` × ``task.max_turns``). A data set's own prompt
    text is not known at launch and is not counted."""
    train, task, rollout = config["train"], config["task"], config["rollout"]
    trajectories = train["prompts_per_step"] * train["group_size"]
    per_trajectory = prompt_chars(task) + rollout["max_new_tokens"] * task["max_turns"]
    value = trajectories * per_trajectory
    return Cost(value, ("train.prompts_per_step", "train.group_size", "rollout.max_new_tokens", "task.max_turns"),
                f"train.prompts_per_step × train.group_size × (prompt + rollout.max_new_tokens × task.max_turns) = "
                f"{train['prompts_per_step']} × {train['group_size']} × ({prompt_chars(task)} + "
                f"{rollout['max_new_tokens']} × {task['max_turns']}) = {value} tokens per step")


def eval_samples_per_step(config: dict) -> Cost:
    """Evaluation's sampled trajectories, amortised over the steps between evaluations: every
    ``train.eval_every`` steps, ``train.eval_prompts`` held-out prompts, each sampled
    ``train.eval_k`` times under pass@k (once, greedy). 0 when the run never evaluates."""
    train = config["train"]
    every, prompts = train.get("eval_every", 0), train.get("eval_prompts", 0)
    per_prompt = train.get("eval_k", 1) if train.get("eval_mode") == "pass@k" else 1
    value = -(-prompts * per_prompt // every) if every else 0  # rounded up
    k = "train.eval_k" if train.get("eval_mode") == "pass@k" else "1 (greedy)"
    return Cost(value, ("train.eval_prompts", "train.eval_k", "train.eval_every", "train.eval_mode"),
                f"train.eval_prompts × {k} / train.eval_every = {prompts} × {per_prompt} / {every} = {value} "
                "evaluation samples per step")


def generator_settings(config: dict) -> Iterator[tuple[str, float]]:
    """(config path, value) of every number in a reasoning-gym dataset's options: the terms,
    digits, lengths, sizes of what it generates, which a step's generation and scoring time
    grow with; lists and nested options included; booleans, ``seed`` and ``size`` are not."""
    if config["task"]["name"] != "reasoning-gym":
        return
    for i, dataset in enumerate(config["task"].get("datasets") or []):
        stack = [(f"task.datasets[{i}].config", dataset.get("config") or {})]
        while stack:
            path, node = stack.pop()
            if isinstance(node, dict):
                stack.extend((f"{path}.{key}", value) for key, value in node.items() if key not in NOT_A_SIZE)
            elif isinstance(node, list):
                stack.extend((f"{path}[{j}]", value) for j, value in enumerate(node))
            elif isinstance(node, (int, float)) and not isinstance(node, bool):
                yield path, node


def dataset_sizes(config: dict) -> Iterator[tuple[str, int]]:
    """(config path, value) of each reasoning-gym dataset's own ``size`` option."""
    if config["task"]["name"] != "reasoning-gym":
        return
    for i, dataset in enumerate(config["task"].get("datasets") or []):
        size = (dataset.get("config") or {}).get("size")
        if isinstance(size, (int, float)) and not isinstance(size, bool):
            yield f"task.datasets[{i}].config.size", size
