"""The rollout engine's costs, measured: what the simulator's shared-engine model
(``learner/sim/shared_engine.py``) needs to replay a recorded run under another schedule.

    python -m learner.bench.engine_cost --config configs/bench.yaml [--rows 32,128,256,512,768]

Runs in its own process, as a rollout worker does (pinned to the core a worker gets, one torch
thread), on the config's engine and policy with its task's own prompts (the policy's chat format):
for each row count, the median of ``REPEATS`` fixed-length ``generate`` calls of 1 and of
``1 + DECODE_STEPS`` tokens. Their difference over ``DECODE_STEPS`` is a decode step with that
many rows (sampling included), timed at the prompts' own width and two turns further on; the
one-token call is the rows' prefill. Least-squares lines over the row counts give the model's
decode step ``a_s + rows * (b_s + b_col_s * width)`` (a step attends over every column of the
batch, and a running call widens by one column a step, from ``prompt_width``) and ``join_s`` per
joining row; on the torch engine also ``copy_s`` per row of the running batch, the copy of its keys
and values that each join and each retirement of ended rows makes (timed two turns on). Prints one
JSON object.

Why measured: a recording of sync holds every batch at about the same number of rows, so it
cannot tell a step's fixed cost from its per-row cost; fully-async carries up to three batches'
rows at once, and how much that slows each of them is exactly the per-row cost.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

DEFAULT_ROWS = (32, 128, 256, 512, 768)
DECODE_STEPS = 8
REPEATS = 5  # medians: a shared machine stalls a call now and then
TIMEOUT_S = 300.0


def line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line, both clamped at 0 (a cost is never negative)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var, 0.0) if var > 0 else 0.0
    return max(my - slope * mx, 0.0), slope


def measure(config_path: str, rows: tuple[int, ...]) -> dict[str, Any]:
    import torch

    from learner.config import load_config
    from learner.tasks.chat import ChatFormat
    from learner.rollout.processes.cores import core_plan, set_process_affinity
    from learner.rollout.engine.torch_engine import SamplingParams
    from learner.rollout.engine.factory import make_engine
    from learner.models.loading import load_tokenizer, resolve_model_dir
    from learner.tasks.registry import make_env

    cfg = load_config(config_path)
    _, worker_cores = core_plan(1, cfg.rollout.pin_cores)
    if worker_cores[0] is not None:
        set_process_affinity({worker_cores[0]})
    torch.set_num_threads(1)
    policy = resolve_model_dir(cfg.model.policy)
    tok = load_tokenizer(policy)
    engine = make_engine(cfg, str(policy), tok, 0)
    env, rng = make_env(cfg.task), random.Random(cfg.seed)
    chat = ChatFormat(tok, env, cfg.task.tool_format)
    prompts = [tok.encode(chat.prompt_text(env.sample_task(rng)), add_special_tokens=False) for _ in range(max(rows))]

    def call_s(n: int, tokens: int) -> float:
        params = SamplingParams(tokens, stop_token_ids=[])  # fixed length: every row decodes every step
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            engine.generate(prompts[:n], params, seeds=list(range(n)))
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    call_s(min(rows), 2)  # warm-up
    prefill = {n: call_s(n, 1) for n in rows}
    _, join_s = line(list(rows), [prefill[n] for n in rows])
    # a decode step attends over every column of the batch, and a running call's batch widens by one
    # column a step: decode steps timed at the prompts' own width and at two turns further on (left
    # padding, as rows of different lengths are padded in the engine) give the cost per row and column
    narrow = max(len(p) for p in prompts)
    wide = narrow + 2 * cfg.rollout.max_new_tokens
    steps_at = {}
    first_turns = prompts
    for width in (narrow, wide):
        prompts = [[tok.pad_token_id] * (width - len(p)) + p for p in first_turns]
        steps_at[width] = {n: max(call_s(n, 1 + DECODE_STEPS) - call_s(n, 1), 0.0) / DECODE_STEPS for n in rows}
    prompts = first_turns
    a_narrow, b_narrow = line(list(rows), [steps_at[narrow][n] for n in rows])
    a_wide, b_wide = line(list(rows), [steps_at[wide][n] for n in rows])
    b_col = max(b_wide - b_narrow, 0.0) / (wide - narrow)
    copy = {n: copy_s(engine, prompts[:n], wide) for n in rows} if hasattr(engine, "_prefill") else {}
    _, copy_per_row = line(list(copy), list(copy.values())) if copy else (0.0, 0.0)
    return {"a_s": (a_narrow + a_wide) / 2, "b_s": b_narrow - b_col * narrow, "b_col_s": b_col,
            "prompt_width": narrow, "join_s": join_s, "copy_s": copy_per_row, "copy_width": wide, "rows": list(rows),
            "decode_step_s": {str(w): {str(n): v for n, v in at.items()} for w, at in steps_at.items()},
            "prefill_s": {str(n): prefill[n] for n in rows}, "copy_s_at": {str(n): v for n, v in copy.items()},
            "prompt_tokens_mean": statistics.fmean(len(p) for p in prompts), "engine": cfg.rollout.engine}


def copy_s(engine, prompts: list[list[int]], width: int) -> float:
    """Median seconds to join one row's keys/values to a running batch of ``len(prompts)`` rows
    ``width`` columns wide: the copy of the whole batch's cache that every join (and every
    retirement of ended rows) makes in the torch engine's continuous batching."""
    from learner.rollout.engine import kv_rows
    from learner.rollout.engine.continuous import _prefill_whole

    padded = [[engine.pad_id] * (width - len(p)) + p for p in prompts]  # (a right-aligned context)
    times = []
    for _ in range(REPEATS):
        cache, attn, _, _ = _prefill_whole(engine, padded)
        one, one_attn, _, _ = _prefill_whole(engine, prompts[:1])
        t0 = time.perf_counter()
        kv_rows.join(cache, attn, one, one_attn)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_in_subprocess(config_path: str, rows: tuple[int, ...] = DEFAULT_ROWS) -> dict[str, Any]:
    """``measure`` in a fresh process (its pinning must not leak into the caller, whose children
    inherit its affinity); raises ``RuntimeError`` naming the reason when it fails."""
    try:
        proc = subprocess.run([sys.executable, "-m", "learner.bench.engine_cost", "--config", config_path,
                               "--rows", ",".join(map(str, rows))], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"engine cost: no answer after {TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"engine cost: exited {proc.returncode}: {last}")
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="run config: its engine, policy and task")
    parser.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)),
                        help=f"row counts to time [{','.join(map(str, DEFAULT_ROWS))}]")
    args = parser.parse_args(argv)
    try:
        rows = tuple(sorted({int(r) for r in args.rows.split(",") if r.strip()}))
    except ValueError:
        parser.error(f"--rows: expected a comma list of positive integers, got {args.rows!r}")
    if len(rows) < 2 or rows[0] < 1:
        parser.error(f"--rows: needs at least two positive row counts, got {args.rows!r}")
    print(json.dumps(measure(args.config, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
