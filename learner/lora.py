"""LoRA adapters on the policy (``model.lora``), with ``peft``.

Only the adapter matrices A and B require gradients, so the learner classes, which take the
model's trainable parameters, stream and accumulate adapter gradients only: every gradient
buffer (G, and S_k, T'_k per open group, docs/architecture.md) is adapter-sized
(``grad_buffer_mb``). The base weights never change.

Rollout engines get merged weights: every weight under its plain Hugging Face name, the
adapted modules' as W + (alpha/r)·B·A, so the torch engine and the vLLM engine load them like
a full-weight publish (vLLM's reload checks that every parameter was written). vLLM's own
LoRA serving is not used: one path for both engines, and the engines sample from exactly the
learner's merged policy.

``save_policy`` writes the final policy: the adapter (``adapter_config.json``,
``adapter_model.safetensors``, loadable with ``peft``) and, in ``merged/``, a plain HF model
with the adapter merged in.
"""

from __future__ import annotations

from pathlib import Path

import torch

from learner.config import LoraSettings

PEFT_PREFIX = "base_model.model."


def with_lora(model: torch.nn.Module, lora: LoraSettings | None) -> torch.nn.Module:
    """``model`` with adapters on ``lora.target_modules`` (base weights frozen), or ``model``."""
    if lora is None:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=list(lora.target_modules),
                        lora_dropout=0.0, bias="none")
    try:
        return get_peft_model(model, config)
    except ValueError as err:  # e.g. a target module the model does not have
        raise ValueError(f"model.lora.target_modules: {str(err).splitlines()[0]}") from None


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _adapted_modules(model: torch.nn.Module):
    from peft.tuners.lora import LoraLayer

    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            yield name.removeprefix(PEFT_PREFIX), module


def publish_view(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What the rollout engines load: every parameter under its plain HF name; for a LoRA
    model the adapted modules' weights merged (the base weights are views, not copies)."""
    if not is_lora(model):
        return dict(model.named_parameters())
    view = {name.replace(".base_layer.", "."): p for name, p in model.get_base_model().named_parameters()
            if ".lora_" not in name}
    with torch.no_grad():
        for name, module in _adapted_modules(model):
            view[f"{name}.weight"] = module.base_layer.weight + module.get_delta_weight("default")
    return view


def grad_buffer_mb(params: list[torch.nn.Parameter], buffers: float) -> float:
    """Memory of ``buffers`` gradient-sized fp32 accumulators over ``params`` (MiB)."""
    return buffers * sum(p.numel() for p in params) * 4 / 2**20


def quiet_deepspeed_probe() -> None:
    """``save_pretrained`` unwraps the model with accelerate, which imports DeepSpeed whenever it
    is installed; without a GPU DeepSpeed's import then warns "Setting accelerator to CPU" into
    the log of a run that never used it. Naming the CPU accelerator skips that detection (a
    DeepSpeed run imported it long before: its accelerator is already chosen)."""
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def save_policy(model: torch.nn.Module, tokenizer, out_dir: str | Path) -> Path:
    """The final policy: a plain model as an HF directory; a LoRA model as its adapter plus
    ``merged/`` (base + adapter, a plain HF directory any engine loads)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    quiet_deepspeed_probe()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if is_lora(model):
        import copy

        merged = copy.deepcopy(model).merge_and_unload()
        merged.save_pretrained(out / "merged")
        tokenizer.save_pretrained(out / "merged")
    return out
