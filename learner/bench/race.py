"""Race the schedules to a reward: every schedule trains the same config, seed by seed, in fresh processes.

    thundersync race [--config configs/race.yaml] [--schedules LIST] [--seeds 0,1,2] [--steps N]
                     [--levels auto|X,Y] [--json F] [--html F] [--events-dir DIR]

Step time says how fast a schedule steps; this says how fast it learns. Per seed, the schedules run
one after another (the order reversed every other seed, so a drifting machine falls on each alike);
each run's per-step rewards are smoothed (an exponential moving average, ``--smoothing``) and read
off against wall-clock from its first step's start and against the tokens it trained. Per
schedule and level: the seeds that reached it, and the median wall-clock seconds and trained
tokens to it with bootstrap 90% intervals over seeds (``learner.bench.intervals``); the curves of
smoothed reward against wall-clock go to the HTML report (docs/bench.md, "The race").

Levels: ``auto`` takes the highest smoothed reward that every run reached after its first step
(so every run crosses it, none at step 0) and the midpoint between it and the runs' median first
reward; without learning in some run (no run above its own start) it says so instead.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from learner.bench.intervals import median_interval
from learner.bench.race_report import write_html
from learner.bench.smoothing import smoothed
from learner.bench.run import Runner, machine_info
from learner.cli_args import number, schedule_list
from learner.config import SCHEDULES, load_config
from learner.timeline import Metric

PROG = "thundersync race"
DEFAULT_CONFIG = "configs/race.yaml"


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not values or any(v < 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"want distinct seeds >= 0, got {text!r}")
    return values


def _levels(text: str) -> list[float] | str:
    if text == "auto":
        return text
    try:
        return sorted(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'auto' or a comma list of rewards, got {text!r}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"the run config every schedule trains [{DEFAULT_CONFIG}]")
    parser.add_argument("--schedules", type=schedule_list, default=list(SCHEDULES), metavar="LIST",
                        help=f"comma list [{','.join(SCHEDULES)}]")
    parser.add_argument("--seeds", type=_int_list, default=[0, 1, 2], metavar="LIST", help="run seeds [0,1,2]")
    parser.add_argument("--steps", type=number(int, 2), help="optimizer steps per run [train.steps of the config]")
    parser.add_argument("--levels", type=_levels, default="auto", metavar="auto|X,Y", help="smoothed reward levels [auto]")
    parser.add_argument("--smoothing", type=number(float, 0.0), default=0.6, metavar="W",
                        help="EMA weight of the previous average, 0 <= W < 1 [0.6]")
    parser.add_argument("--json", metavar="FILE", help="write the runs' curves and the per-schedule figures")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained plotly report")
    parser.add_argument("--events-dir", metavar="DIR", help="keep every run's config and JSONL events here")


def curve(events: list[dict[str, Any]], weight: float) -> dict[str, list[float]]:
    """One run's steps: wall-clock at each step's end from the first step's start, cumulative
    trained tokens, reward and smoothed reward."""
    steps = sorted((e for e in events if e.get("type") == "metrics"), key=lambda e: e["step"])
    if not steps:
        raise ValueError("the run recorded no step")
    start = steps[0]["values"][Metric.T_START]
    seconds = [e["values"][Metric.T_END] - start for e in steps]
    tokens, total = [], 0.0
    for e in steps:
        total += e["values"].get(Metric.TOKENS, 0.0)
        tokens.append(total)
    rewards = [e["values"][Metric.REWARD_MEAN] for e in steps]
    return {"seconds": seconds, "tokens": tokens, "reward": rewards, "smoothed": smoothed(rewards, weight)}


def auto_levels(curves: list[dict[str, list[float]]]) -> tuple[list[float], str | None]:
    """(levels, why none) from every run's smoothed curve (module docstring)."""
    common = min(max(c["smoothed"][1:], default=float("-inf")) for c in curves)
    start = statistics.median(c["smoothed"][0] for c in curves)
    if common <= start:
        return [], (f"no level every run crosses after its first step above the median first reward "
                    f"{start:.3f} (the highest all reached is {common:.3f}): no run learnt beyond its start")
    # rounded down, never up: a level rounded above the lowest run's best would not be crossed by it
    return [math.floor((start + (common - start) / 2) * 1e4) / 1e4, math.floor(common * 1e4) / 1e4], None


def to_level(c: dict[str, list[float]], level: float) -> dict[str, Any] | None:
    """Seconds, trained tokens and step at the end of the first step at or above ``level``, after step 0."""
    for i, value in enumerate(c["smoothed"]):
        if i > 0 and value >= level:
            return {"seconds": c["seconds"][i], "tokens": c["tokens"][i], "step": i}
    return None


def figures(runs: dict[str, dict[int, dict]], levels: list[float]) -> dict[str, Any]:
    """Per schedule: per level, the seeds that reached it and the medians with intervals over seeds."""
    out: dict[str, Any] = {}
    for name, per_seed in runs.items():
        levels_out = []
        for level in levels:
            hits = [h for h in (to_level(c, level) for c in per_seed.values()) if h is not None]
            secs, toks = [h["seconds"] for h in hits], [h["tokens"] for h in hits]
            levels_out.append({
                "level": level, "reached": len(hits), "seeds": len(per_seed),
                "seconds_median": statistics.median(secs) if secs else None, "seconds_ci90": median_interval(secs),
                "tokens_median": statistics.median(toks) if toks else None, "tokens_ci90": median_interval(toks),
            })
        finals = [c["smoothed"][-1] for c in per_seed.values()]
        out[name] = {"levels": levels_out, "final_smoothed_median": statistics.median(finals),
                     "final_smoothed_ci90": median_interval(finals),
                     "wall_s_median": statistics.median(c["seconds"][-1] for c in per_seed.values())}
    return out


def summary_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    if doc.get("no_level"):
        lines.append(f"levels: {doc['no_level']}")
    for name, f in doc["schedules"].items():
        parts = []
        for lv in f["levels"]:
            if lv["seconds_median"] is None:
                parts.append(f">= {lv['level']:.3f}: not reached ({lv['reached']}/{lv['seeds']})")
                continue
            ci = lv["seconds_ci90"]
            parts.append(f">= {lv['level']:.3f}: {lv['seconds_median']:.1f} s" + (f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else "")
                         + f", {lv['tokens_median']:.0f} tokens ({lv['reached']}/{lv['seeds']} seeds)")
        lines.append(f"{name:12s} final {f['final_smoothed_median']:.3f}; " + "; ".join(parts))
    return lines


def run(args: argparse.Namespace) -> int:
    if not 0.0 <= args.smoothing < 1.0:
        print(f"{PROG}: error: --smoothing: must be in [0, 1), got {args.smoothing}", file=sys.stderr)
        return 2
    base = load_config(args.config)  # ConfigError: the CLI prints it and exits 2
    steps = args.steps or base.train.steps
    if steps < 2:
        print(f"{PROG}: error: --steps: a race needs at least 2 steps, got {steps}", file=sys.stderr)
        return 2
    machine = machine_info()
    runs: dict[str, dict[int, dict]] = {name: {} for name in args.schedules}
    with tempfile.TemporaryDirectory(prefix="thundersync-race-") as tmp:
        workdir = Path(args.events_dir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for i, seed in enumerate(args.seeds):
            cfg = base.model_copy(deep=True)
            cfg.seed = seed
            runner = Runner(cfg, workdir)
            for name in args.schedules if i % 2 == 0 else list(reversed(args.schedules)):
                try:
                    events = runner.train(f"race-{name}-seed{seed}", name, steps, cfg.task.tool_latency.scale)
                    runs[name][seed] = curve(events, args.smoothing)
                except Exception as err:  # a failed run is reported with its cause, the race stops
                    print(f"{PROG}: failed: {err}", file=sys.stderr)
                    return 1
    import os

    machine["load_avg_end"] = list(os.getloadavg())
    curves = [c for per_seed in runs.values() for c in per_seed.values()]
    levels, no_level = (auto_levels(curves) if args.levels == "auto" else (args.levels, None))
    doc = {"config": args.config, "steps": steps, "seeds": args.seeds, "smoothing": args.smoothing,
           "levels": levels, "no_level": no_level, "schedules": figures(runs, levels),
           "curves": {name: {str(s): c for s, c in per_seed.items()} for name, per_seed in runs.items()},
           "machine": machine}
    print("\n".join(summary_lines(doc)))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.html:
        write_html(doc, Path(args.html), summary_lines(doc))
    return 0
