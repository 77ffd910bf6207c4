"""SFT warm start of the built-in models: a short supervised pass on canonical ``arith-tool``
traces (loss on assistant tokens only), so RL starts from a nonzero but imperfect success
rate and the teacher is clearly stronger. ``models/loading.py`` builds, caches and loads
the result."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from learner.config import TaskConfig
from learner.tasks.env import ArithToolEnv, canonical_turns


@dataclass(frozen=True)
class BuildRecipe:
    """Architecture and SFT schedule of a built-in model (all of it enters the cache hash)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    sft_steps: int
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 30
    max_position_embeddings: int = 256  # RoPE: a limit on context length, not parameters
    # Share of SFT traces that answer at once without the calculator. A policy warm-started
    # on a mix tries both behaviours; only the tool path is reliably right, so RL has a
    # clear lever (learn to call the tool) on top of sharpening its copying.
    direct_answer_fraction: float = 0.0


def sft_batch(
    tokenizer: PreTrainedTokenizerFast, env: ArithToolEnv, rng: random.Random, batch_size: int,
    direct_answer_fraction: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded canonical traces: (input_ids, attention_mask, labels), each (B, T).

    ``labels`` is the token where it was written by the assistant and -100 on the prompt,
    the observations and padding, so the loss covers assistant turns only.
    """
    rows: list[tuple[list[int], list[int]]] = []
    for _ in range(batch_size):
        task = env.sample_task(rng)
        ids = tokenizer.encode(task.prompt_text, add_special_tokens=False)
        mask = [0] * len(ids)
        turns = canonical_turns(task)
        if rng.random() < direct_answer_fraction:
            turns = turns[-1:]  # the answer turn alone: no tool call
        for turn, observation in turns:
            turn_ids = tokenizer.encode(turn, add_special_tokens=False)
            ids += turn_ids
            mask += [1] * len(turn_ids)
            if observation is not None:
                obs_ids = tokenizer.encode(observation, add_special_tokens=False)
                ids += obs_ids
                mask += [0] * len(obs_ids)
        rows.append((ids, mask))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((batch_size, width), tokenizer.pad_token_id)  # (B, T)
    attention = torch.zeros((batch_size, width), dtype=torch.long)  # (B, T)
    labels = torch.full((batch_size, width), -100)  # (B, T)
    for b, (ids, mask) in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention[b, : len(ids)] = 1
        labels[b, : len(ids)] = torch.where(torch.tensor(mask) == 1, torch.tensor(ids), -100)
    return input_ids, attention, labels


def sft_warm_start(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, task: TaskConfig, recipe: BuildRecipe, seed: int
) -> list[float]:
    """AdamW on the mean next-token cross-entropy over assistant tokens, linear warmup
    then cosine decay; returns the loss per step."""
    env = ArithToolEnv(task)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)

    def lr_factor(step: int) -> float:
        if step < recipe.warmup_steps:
            return (step + 1) / recipe.warmup_steps
        progress = (step - recipe.warmup_steps) / max(1, recipe.sft_steps - recipe.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    losses = []
    for _ in range(recipe.sft_steps):
        input_ids, attention, labels = sft_batch(tokenizer, env, rng, recipe.batch_size, recipe.direct_answer_fraction)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    return losses
