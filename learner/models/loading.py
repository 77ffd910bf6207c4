"""Built-in tiny Llama policy and teacher, their build and cache; loading any local Hugging
Face model directory.

``builtin:tiny`` and ``builtin:teacher`` are built on first use. At seed 0 (the default
``model.builtin_seed``) the weights ship with the package (``builtin_weights/``, checked by
sha256): trained on a CPU, the SFT warm start's result differs in the last bits from one
processor's kernels to another's, and so would every sample drawn from it. Any other recipe or
seed is trained here: a ``LlamaForCausalLM`` initialised from the seed, then the SFT warm start
of ``models/warm_start.py``. The result is an ordinary HF directory under ``<cache_dir>/models/<name>-<hash>/``, where the hash covers the build recipe, the seed
and ``CODE_VERSION``. It is written into a temporary directory and renamed into place under
a file lock, so concurrent processes never see a half-written model and build it once.

Nothing here touches the network: loading uses ``local_files_only`` and HF_HUB_OFFLINE.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.utils import logging as hf_logging

from learner.config import TaskConfig
from learner.grad.objectives import compute_dtype
from learner.preflight import BUILTIN_PREFIX, is_model_dir  # noqa: F401  (re-exported: checked without torch)
from learner.tasks.env import STOP_TOKENS
from learner.tasks.char_tokenizer import build_char_tokenizer
from learner.models.warm_start import BuildRecipe, sft_warm_start

# Bump when the build code changes what a cached model contains.
CODE_VERSION = "4"  # 3: the tokenizer ships BUILTIN_CHAT_TEMPLATE; 4: seed-0 weights are the shipped ones

SHIPPED_DIR = Path(__file__).with_name("builtin_weights")


# Calibrated on the default TaskConfig, seed 0, sampling at temperature 1.0: the policy
# calls the tool on about half the tasks and solves about 22% (RL has signal and room: in
# configs/arith-grpo.yaml it learns to call the tool), the teacher about 95% (OPD has a
# clearly better target). About 55 s and 45 s of one CPU core to build.
BUILTIN_RECIPES: dict[str, BuildRecipe] = {
    "tiny": BuildRecipe(hidden_size=64, num_layers=3, num_heads=4, intermediate_size=192, sft_steps=600,
                        direct_answer_fraction=0.5),
    "teacher": BuildRecipe(hidden_size=64, num_layers=3, num_heads=4, intermediate_size=192, sft_steps=500),
}


# Built-ins that are another built-in's weights with a longer context limit: RoPE positions are
# not parameters, so only config.json's max_position_embeddings (the rollout's limit on a
# prompt plus its turns) differs. ``tiny-long`` is the policy of configs/long-prompt.yaml, whose
# prompts start with a ~600-token tool description.
LONG_CONTEXT: dict[str, tuple[str, int]] = {"tiny-long": ("tiny", 2048)}


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "thundersync"


def builtin_dir_name(name: str, seed: int) -> str:
    recipe = BUILTIN_RECIPES[name]
    key = json.dumps({"recipe": dataclasses.asdict(recipe), "seed": seed, "code": CODE_VERSION}, sort_keys=True)
    return f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def resolve_model_dir(spec: str, cache_dir: str | None = None, seed: int = 0) -> Path:
    """Map ``'builtin:tiny'``, ``'builtin:teacher'`` or a local HF directory to a directory
    holding config.json, weights and tokenizer files; built-ins are built on first use."""
    if spec.startswith(BUILTIN_PREFIX):
        name = spec.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN_RECIPES and name not in LONG_CONTEXT:
            known = ", ".join(BUILTIN_PREFIX + n for n in [*BUILTIN_RECIPES, *LONG_CONTEXT])
            raise ValueError(f"model spec {spec!r}: unknown built-in model (known: {known})")
        root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        if name in LONG_CONTEXT:
            return _long_context(name, root / "models", seed)
        return _cached_build(name, root / "models", seed)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ValueError(f"model spec {spec!r}: not 'builtin:tiny', 'builtin:teacher' or an existing directory")
    if not is_model_dir(path):
        raise ValueError(f"model spec {spec!r}: directory has no config.json and weights (*.safetensors / *.bin)")
    return path


def _offline_and_quiet() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: every load also passes local_files_only
    hf_logging.disable_progress_bar()  # per-shard bars of a one-shard model are noise on stderr


def load_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    _offline_and_quiet()
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, local_files_only=True)
    return widen_norms(model).eval()


class WideRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm computed in float64 for float64 inputs.

    HF's version always computes in float32, so a "float64" Llama carries float32 rounding
    (~1e-7) that would make the float64 tolerances (docs/math.md) unreachable whatever the
    learner does.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        h = hidden_states.to(compute_dtype(hidden_states.dtype))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(hidden_states.dtype)


def widen_norms(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 Llama that is float64 throughout (its norms included); other dtypes unchanged."""
    if next(model.parameters()).dtype == torch.float64:
        for module in model.modules():
            if isinstance(module, LlamaRMSNorm):
                module.__class__ = WideRMSNorm
    return model


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    _offline_and_quiet()
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def stop_token_ids(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """Ids of the tokens that end a turn (``STOP_TOKENS``)."""
    return tokenizer.convert_tokens_to_ids(list(STOP_TOKENS))


# ---------------------------------------------------------------------------------------
# Build: init from seed, SFT warm start, atomic write into the cache.


@contextmanager
def _file_lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_build(name: str, models_dir: Path, seed: int) -> Path:
    final = models_dir / builtin_dir_name(name, seed)
    if is_model_dir(final):
        return final
    with _file_lock(models_dir / f".{final.name}.lock"):
        if is_model_dir(final):  # another process built it while we waited
            return final
        for stale in models_dir.glob(f".{final.name}-*"):  # left by a killed builder
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=models_dir))
        try:
            build_builtin(name, tmp, seed)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared
            os.replace(tmp, final)  # atomic on one filesystem: readers see all or nothing
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return final


def _long_context(name: str, models_dir: Path, seed: int) -> Path:
    """The ``LONG_CONTEXT`` built-in ``name``: a copy of its base with the longer limit."""
    base_name, limit = LONG_CONTEXT[name]
    base = _cached_build(base_name, models_dir, seed)
    final = models_dir / f"{name}-{base.name.rsplit('-', 1)[1]}-{limit}"
    if is_model_dir(final):
        return final
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=models_dir))
    try:
        shutil.copytree(base, tmp, dirs_exist_ok=True)
        config = json.loads((tmp / "config.json").read_text())
        config["max_position_embeddings"] = limit
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tmp.chmod(0o755)
        os.replace(tmp, final)
    except OSError:
        if not is_model_dir(final):  # not another process that built it first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def build_builtin(name: str, out_dir: Path, seed: int) -> None:
    """Initialise, warm-start and save built-in model ``name`` into ``out_dir``.

    Runs single-threaded so the weights are a function of (recipe, seed) alone, not of the
    caller's thread count.
    """
    _offline_and_quiet()
    recipe = BUILTIN_RECIPES[name]
    tokenizer = build_char_tokenizer()
    shipped = shipped_weights(name, seed)
    if shipped is not None:
        _write_from_shipped(shipped, _llama_config(recipe, tokenizer), tokenizer, out_dir)
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        model = LlamaForCausalLM(_llama_config(recipe, tokenizer))
        sft_warm_start(model, tokenizer, TaskConfig(), recipe, seed)
    finally:
        torch.set_num_threads(threads)
    model.generation_config = _generation_config(tokenizer)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    return GenerationConfig(eos_token_id=stop_token_ids(tokenizer), pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id)


def _shipped_manifest() -> dict:
    return json.loads((SHIPPED_DIR / "manifest.json").read_text())["models"]


def shipped_weights(name: str, seed: int) -> Path | None:
    """The shipped weight file of built-in ``name`` if its recipe and seed are the shipped ones
    (checked by sha256: a damaged file is an error, not a silently different model), else None."""
    entry = _shipped_manifest().get(name)
    if entry is None or entry["seed"] != seed or entry["recipe"] != dataclasses.asdict(BUILTIN_RECIPES[name]):
        return None
    path = SHIPPED_DIR / entry["file"]
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    if digest != entry["sha256"]:
        raise ValueError(f"model spec 'builtin:{name}': shipped weights {path} have sha256 {digest}, "
                         f"the manifest says {entry['sha256']}; reinstall the package")
    return path


def _write_from_shipped(weights: Path, config: LlamaConfig, tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """The HF directory ``save_pretrained`` would write, with the shipped weight file itself."""
    config.architectures = ["LlamaForCausalLM"]  # what a model's save_pretrained records
    config.dtype = torch.float32
    config.save_pretrained(out_dir)
    _generation_config(tokenizer).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    shutil.copyfile(weights, out_dir / "model.safetensors")


def write_shipped(names: list[str]) -> None:
    """Train built-ins ``names`` from their recipes at seed 0 and make them the shipped weights."""
    manifest = json.loads((SHIPPED_DIR / "manifest.json").read_text())
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            recipe, seed = BUILTIN_RECIPES[name], 0
            manifest["models"].pop(name, None)  # train, do not copy the old file
            (SHIPPED_DIR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
            build_builtin(name, Path(tmp), seed)
            target = SHIPPED_DIR / f"{name}.safetensors"
            shutil.copyfile(Path(tmp) / "model.safetensors", target)
        manifest["models"][name] = {"file": target.name, "seed": seed, "recipe": dataclasses.asdict(recipe),
                                    "sha256": hashlib.sha256(target.read_bytes()).hexdigest()}
        (SHIPPED_DIR / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"{name}: {target} sha256 {manifest['models'][name]['sha256']}")


def _llama_config(recipe: BuildRecipe, tokenizer: PreTrainedTokenizerFast) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


# ---------------------------------------------------------------------------------------
# Evaluation: a small batched agent loop (the real one lives in rollout/processes/agent_worker.py).


@torch.no_grad()
def generate_turns(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    contexts: list[list[int]],
    temperature: float,
    max_new_tokens: int,
) -> list[list[int]]:
    """One turn for each context, left-padded into one ``generate`` call; each result
    ends at its first stop token (or at ``max_new_tokens``). ``temperature`` 0 = greedy."""
    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])  # (B, T)
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])  # (B, T)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else {"do_sample": False}
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_token_ids(tokenizer),
        pad_token_id=pad,
        **sampling,
    )[:, width:]  # (B, new)
    stops = set(stop_token_ids(tokenizer))
    turns = []
    for row in out.tolist():
        end = next((i + 1 for i, tok in enumerate(row) if tok in stops), len(row))
        turns.append(row[:end])
    return turns


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="rebuild the shipped built-in weights from their recipes")
    parser.add_argument("--write-shipped", nargs="+", choices=sorted(BUILTIN_RECIPES), required=True, metavar="NAME")
    write_shipped(parser.parse_args().write_shipped)
