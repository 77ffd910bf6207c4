"""A fixed learner computation timed at the start and end of every run: the machine's speed.

A shared VM's speed drifts by up to 2x within minutes, so schedules run minutes apart are not
on the same machine. The bench divides runs' probes to compare them at one speed. The probe is
the same forward + backward of one fixed 96-token sequence in every run, timed while the rollout
fleet is idle (before the first dispatch, after the fleet settled), so neither the schedule's
own learner code nor its overlap with the rollout moves it; only the machine does.
"""

from __future__ import annotations

import statistics
import time

import torch

PROBE_TOKENS = 96
PROBE_PASSES = 15


def speed_probe_ms(model: torch.nn.Module, passes: int = PROBE_PASSES) -> float:
    """Median ms of one forward + backward of a fixed sequence; leaves no gradient behind."""
    params = [p for p in model.parameters() if p.requires_grad]
    device = params[0].device
    vocab = model.get_input_embeddings().num_embeddings
    ids = (torch.arange(PROBE_TOKENS, device=device) * 7 % vocab)[None]  # (1, T), no RNG drawn
    times = []
    for _ in range(passes + 1):  # the first pass warms the allocator and is not counted
        t0 = time.perf_counter()
        logits = model(input_ids=ids).logits  # (1, T, V)
        logits.float().log_softmax(-1).mean().backward()
        for p in params:
            p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[1:])
