"""Step metrics into the tools people already watch: TensorBoard event files and W&B (offline).

Both are ``EventSink``s beside the JSONL stream (``thundersync train --tensorboard DIR``,
``--wandb``, or the run config's ``tracking`` section). They log each step's metrics as
scalars at that step, and the run's summary at the end; spans stay in the JSONL stream and
the Chrome trace. Each step's ~25 scalars are handed to the library's own writer (TensorBoard's
``SummaryWriter`` writes from its own thread), so the learner's cost is ~1 ms per step.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Callable

from learner.timeline import Span, StepMetrics, as_event


def _scalars(values: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


class TensorBoardSink:
    """Writes ``events.out.tfevents.*`` under ``logdir`` (``tensorboard --logdir DIR`` shows them)."""

    def __init__(self, logdir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # torch.utils.tensorboard needs the tensorboard package
            raise RuntimeError(f"--tensorboard needs the 'tensorboard' package ({err}): pip install tensorboard") from None
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(logdir))

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None:
        event = as_event(event)
        if event["type"] == "metrics":
            for name, value in _scalars(event["values"]).items():
                self.writer.add_scalar(name, value, global_step=event["step"])
        elif event["type"] == "run" and event.get("status") == "finished":
            for name, value in _scalars(event.get("summary") or {}).items():
                self.writer.add_scalar(f"summary/{name}", value, global_step=0)
            self.writer.flush()

    def idle(self, busy: Callable[[], bool]) -> None:
        pass

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Weights & Biases in offline mode (no network: ``wandb sync DIR`` uploads later)."""

    def __init__(self, run_name: str, config: dict, directory: str | Path):
        try:
            import wandb
        except ImportError:
            raise RuntimeError("--wandb needs the 'wandb' package: pip install wandb") from None
        os.environ.setdefault("WANDB_MODE", "offline")
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project="thundersync", name=run_name, config=config, dir=str(directory),
                              mode="offline")

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None:
        event = as_event(event)
        if event["type"] == "metrics":
            self.run.log(_scalars(event["values"]), step=event["step"])
        elif event["type"] == "run" and event.get("status") == "finished":
            self.run.summary.update(_scalars(event.get("summary") or {}))

    def idle(self, busy: Callable[[], bool]) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


def tracking_sinks(cfg) -> list:
    """The sinks the run config's ``tracking`` section asks for; ConfigError when one cannot be made."""
    from learner.config import ConfigError

    sinks: list = []
    try:
        if cfg.tracking.tensorboard:
            sinks.append(TensorBoardSink(cfg.tracking.tensorboard))
        if cfg.tracking.wandb:
            sinks.append(WandbSink(cfg.name, cfg.model_dump(), Path(cfg.tracking.tensorboard or ".") / "wandb"))
    except (RuntimeError, OSError) as err:
        for sink in sinks:
            sink.close()
        field = "tracking.wandb" if sinks or not cfg.tracking.tensorboard else "tracking.tensorboard"
        raise ConfigError(f"{field}: {err}") from None
    return sinks
