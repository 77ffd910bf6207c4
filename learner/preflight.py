"""What can be checked about a run before any process starts, without torch.

``thundersync train`` runs these before it boots the rollout workers (which import torch
for seconds and take hundreds of MB): a model path that does not exist or an output
directory it cannot write must be a one-line error at once, not after the workers are up
or after step 0. Each failure is a ``ConfigError`` naming the field or flag. A task that calls
the ``python-sandbox`` tool where bubblewrap cannot confine it is one of them
(``check_sandbox``): no rollout worker ever runs policy-written code unconfined.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from learner.config import ConfigError, RunConfig
from learner.tasks import sandbox_bwrap
from learner.registries.objectives import objective as objective_of
from learner.registries.engines import rollout_engine

BUILTIN_PREFIX = "builtin:"
# learner/models/loading.py's BUILTIN_RECIPES and LONG_CONTEXT, named here without torch so a
# wrong name is refused before anything starts (tests/learner/test_builtin_names.py keeps them equal)
BUILTIN_MODELS = ("tiny", "teacher", "tiny-long")
# The vLLM engine verifies drafts from each sampled position's whole distribution, read back from
# vLLM's prompt log-probs one Python object per (position, token) (rollout/vllm_backend/vllm_verify.py), so
# speculation on it is bounded to small vocabularies (rollout/vllm_backend/vllm_engine.py imports this bound).
MAX_VLLM_VERIFY_VOCAB = 4096


def builtin_problem(field: str, spec: str) -> str | None:
    """Why ``spec`` (a ``builtin:`` model name) names no built-in model, or None."""
    if spec.startswith(BUILTIN_PREFIX) and spec.removeprefix(BUILTIN_PREFIX) not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + name for name in BUILTIN_MODELS)
        return f"{field}: {spec!r} is not a built-in model ({known}) nor a directory"
    return None


def is_model_dir(path: Path) -> bool:
    """A Hugging Face model directory: config.json and weights."""
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / "config.json").is_file() and has_weights


def check_model_paths(cfg: RunConfig) -> None:
    specs = {"model.policy": cfg.model.policy}
    if objective_of(cfg.algorithm.objective).teacher_scored:
        specs["model.teacher"] = cfg.model.teacher
    for field, spec in specs.items():
        if problem := builtin_problem(field, spec):
            raise ConfigError(problem)
        if not spec.startswith(BUILTIN_PREFIX) and not is_model_dir(Path(spec).expanduser()):
            raise ConfigError(f"{field}: {spec!r} is not a Hugging Face model directory (config.json + weights)")


def model_vocab_size(path: Path) -> int | None:
    """``vocab_size`` from a model directory's config.json (a multimodal model's text config), or None."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    size = config.get("vocab_size", text.get("vocab_size"))
    return size if isinstance(size, int) else None


def check_vllm_speculation(cfg: RunConfig) -> None:
    """Speculation on the vLLM engine needs a vocabulary it can verify (``MAX_VLLM_VERIFY_VOCAB``):
    refused here, before the workers boot vLLM, not in each worker's engine constructor."""
    if not rollout_engine(cfg.rollout.engine).speculation_preflight or not cfg.rollout.speculation.enabled:
        return
    if cfg.model.policy.startswith(BUILTIN_PREFIX):
        return  # the built-in models' vocabularies are a few dozen tokens
    size = model_vocab_size(Path(cfg.model.policy).expanduser())
    if size is not None and size > MAX_VLLM_VERIFY_VOCAB:
        raise ConfigError(f"rollout.speculation: the vllm engine verifies drafts from full-vocabulary prompt "
                          f"log-probs, for vocabularies up to {MAX_VLLM_VERIFY_VOCAB} tokens; {cfg.model.policy} "
                          f"has {size} (use rollout.engine: torch, or turn speculation off)")


def check_sandbox(cfg: RunConfig) -> None:
    """A run whose task calls ``python-sandbox`` starts only where bwrap can confine the calls
    (probed once per process: a trivial confined call, tens of milliseconds)."""
    if problem := sandbox_bwrap.refusal(cfg.task):
        raise ConfigError(problem)


def check_writable_dir(flag: str, path: str | Path) -> Path:
    """Create ``path`` if needed and prove a file can be written there."""
    path = Path(path).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".thundersync-probe-"):
            pass
    except OSError as err:
        raise ConfigError(f"{flag}: cannot write to {path}: {err.strerror or err}") from None
    return path


def check_writable_file(flag: str, path: str) -> None:
    """The file's directory exists and is writable (the file itself is written later)."""
    if path == "-":
        return
    parent = Path(path).expanduser().parent
    if not parent.is_dir():
        raise ConfigError(f"{flag}: {parent} is not a directory")
    if not os.access(parent, os.W_OK):
        raise ConfigError(f"{flag}: cannot write to {parent}")


def preflight(cfg: RunConfig, dump_dir: str | None = None, output_dir: str | None = None,
              events: str | None = None) -> None:
    check_model_paths(cfg)
    check_vllm_speculation(cfg)
    check_sandbox(cfg)
    if cfg.train.checkpoint_every and not cfg.train.output_dir:  # the web app gives every run one
        raise ConfigError("train.checkpoint_every: checkpoints need train.output_dir (--output DIR)")
    if dump_dir:
        check_writable_dir("--dump-step", dump_dir)
    if output_dir:
        check_writable_dir("--output", output_dir)
    if events:
        check_writable_file("--events", events)
    if cfg.task.name == "reasoning-gym":  # a few items of each generator, under a time and memory limit
        from learner.tasks.gym_probe import probe_generators

        probe_generators(cfg.task, cfg.seed)
