"""The rows of ``thundersync bench``: each schedule with its best learner, and rows that run a
schedule another way (docs/bench.md, "The baseline" and "The speculation rows").

    sync-per-trajectory   sync with the earlier learner, one forward+backward per trajectory: a
                          reference beside the micro-batched sync, held against its own R and L
    sync+spec,            sync / streaming with cross-iteration speculation on
    streaming+spec        (``rollout.speculation.enabled``, the rest of the config unchanged):
                          present when the config schema has ``rollout.speculation``
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from learner.config import RunConfig


@dataclass(frozen=True)
class Row:
    schedule: str
    learner_path: str = "auto"  # the schedule's best learner (learner.path)
    speculation: bool = False
    alone: bool = False  # held against its own R, L and work instead of the micro-batched sync's


REFERENCE_ROWS = {"sync-per-trajectory": Row("sync", "per-trajectory", alone=True)}
SPECULATION_ROWS = {"sync+spec": Row("sync", speculation=True), "streaming+spec": Row("streaming", speculation=True)}
# per-step metrics of the speculation rows, reported as their medians over the measured steps
SPECULATION_METRICS = ("speculation/kept_token_share", "speculation/whole_draft_share", "rollouter/busy_share")


def row_of(name: str) -> Row:
    return REFERENCE_ROWS.get(name) or SPECULATION_ROWS.get(name) or Row(name)


def bench_rows(schedules: list[str], reference: bool, speculation: bool) -> list[str]:
    """The rows a comparison runs, in order: sync first, the reference row, the schedules, then
    the speculation rows of the schedules run (``speculation``)."""
    rows = ["sync", *(REFERENCE_ROWS if reference else []), *schedules]
    if speculation:
        rows += [name for name, row in SPECULATION_ROWS.items() if row.schedule in rows]
    return list(dict.fromkeys(rows))


def row_config(base: RunConfig, name: str) -> RunConfig:
    """The run config of a bench row: ``base`` with the row's schedule, learner and speculation."""
    row = row_of(name)
    cfg = base.model_copy(deep=True)
    cfg.train.schedule = row.schedule
    cfg.learner.path = row.learner_path
    cfg.rollout.speculation.enabled = row.speculation
    return cfg


def speculation_metrics(steps: list[dict[str, float]]) -> dict[str, float]:
    """Medians over a row's measured steps of the speculation metrics its runs recorded (every
    row records ``rollouter/busy_share``; drafting rows the rest)."""
    return {name.split("/")[1]: statistics.median(v[name] for v in steps)
            for name in SPECULATION_METRICS if steps and all(name in v for v in steps)}


def speculation_factors(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The two gains apart: the overlap factor, sync / streaming step (what streaming's schedule
    gains without speculation), and what speculation adds, X / X+spec step for sync and streaming."""
    step = {name: r["step_s"] for name, r in results.items()}
    out = {"overlap_factor": step["sync"] / step["streaming"]} if "streaming" in step else {}
    for name, row in SPECULATION_ROWS.items():
        if name in step and row.schedule in step:
            out[f"speculation_factor_{row.schedule}"] = step[row.schedule] / step[name]
    return out
