"""Simulate sync, async, fully-async and streaming on a recorded or modelled workload.

`thundersync simulate` runs a discrete-event model of the four schedules (docs/schedules.md) and
prints step time, the R/L bound, idle ratios and staleness per schedule. The Python API
(``simulate``, ``simulate_all``, ``simulate_spans``, ``workload_from_spans``,
``synthetic_workload``) lives in learner/sim/results.py and learner/sim/workload.py and
is re-exported here; the model itself is described in learner/sim/engine.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from learner.config import SCHEDULES
from learner.cli_args import number, schedule_list
from learner.sim.engine import ASSIGN_POLICIES
from learner.sim.results import ScheduleResult, report, simulate, simulate_all, simulate_spans, simulated_events
from learner.sim.shared_engine import EngineCost, with_shared_engine
from learner.sim.workload import (
    PAPER_PRESET, PAPER_REFERENCE, ROLLOUT_DISTS, SimInputError, SyntheticSpec, Workload, load_events,
    synthetic_workload, with_overrides, workload_from_spans,
)

__all__ = [
    "ScheduleResult", "SyntheticSpec", "Workload", "add_arguments", "report", "run", "simulate", "simulate_all",
    "simulate_spans", "simulated_events", "synthetic_workload", "workload_from_spans",
]

EPILOG = """\
workload, two ways:
  --spans FILE.jsonl   replay a recorded run: each trajectory's rollout duration is the
                       envelope of its rollout spans (first t0 to last t1: the slot is held
                       through tool waits, and teacher.score overlaps the tool, so a sum
                       would double count), its backward is the sum of its learner.backward
                       spans; closes, optimizer and publish as recorded; slots and ranks =
                       distinct rollout/... and learner/... lanes.
  distributions        --prompts x --group-size trajectories per step; rollout durations
                       drawn from --rollout-dist and rescaled so the slowest of each batch
                       takes --rollout-makespan; per-trajectory backward on one rank =
                       (--learner-total - reduce - optimizer - publish - prompts x close)
                       x ranks / trajectories, so a batch trained alone takes --learner-total.

--preset paper (also the defaults): ThunderSyncRL, Qwen 27B, 32 x 8 trajectories, 8xB200,
  rollout makespan 650.0 s, learner 646.4 s. Assumed: optimizer 5.0 s + publish 12.2 s
  (= 687.7 - 650.0 - 20.5, the cost after the gradient that streaming cannot hide);
  reduction 0.86 s + close 0.01 s + one 19.6 s backward = the paper's 20.5 s tail;
  lognormal rollouts, sigma 1.0 (slowest ~16x the median); one slot per trajectory.
  Paper measured: sync 1,296-1,314 s, streaming 687.7 s, async 695.0 s, fully-async 690.0 s.

Steps run from publish to publish; the summary is over the steps after --warmup.
"""


# flag -> SyntheticSpec field; these describe a modelled workload, so --spans refuses them
SPEC_FLAGS = {
    "--prompts": "prompts", "--group-size": "group_size", "--rollout-makespan": "rollout_makespan_s",
    "--rollout-dist": "rollout_dist", "--rollout-sigma": "rollout_sigma", "--learner-total": "learner_total_s",
    "--backward-sigma": "backward_sigma", "--optimizer-s": "optimizer_s", "--publish-s": "publish_s",
    "--reduce-s": "reduce_s", "--group-close-s": "group_close_s",
}
# machine shape: modelled, or a what-if override of a recording
SHAPE_FLAGS = {"--rollout-slots": "rollout_slots", "--learner-ranks": "learner_ranks"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    pos_int, nonneg_int = number(int, 1), number(int, 0)
    pos_s, nonneg_s = number(float, 0.0, strict=True), number(float, 0.0)
    src = parser.add_argument_group("workload source")
    src.add_argument("--spans", metavar="FILE", help="replay a recorded JSONL event file (thundersync train --events)")
    src.add_argument("--preset", choices=["paper"], help="ThunderSyncRL paper workload (the defaults; see below)")
    d = parser.add_argument_group("modelled workload (defaults: the paper preset)")
    d.add_argument("--prompts", type=pos_int, metavar="N", help=f"groups per step [{PAPER_PRESET.prompts}]")
    d.add_argument("--group-size", type=pos_int, metavar="N", help=f"trajectories per group [{PAPER_PRESET.group_size}]")
    d.add_argument("--rollout-makespan", type=pos_s, metavar="S",
                   help=f"slowest trajectory of every batch, seconds [{PAPER_PRESET.rollout_makespan_s}]")
    d.add_argument("--rollout-dist", choices=ROLLOUT_DISTS, help=f"shape of rollout durations [{PAPER_PRESET.rollout_dist}]")
    d.add_argument("--rollout-sigma", type=nonneg_s, metavar="SIGMA",
                   help=f"lognormal shape; larger = longer tail [{PAPER_PRESET.rollout_sigma}]")
    d.add_argument("--learner-total", type=pos_s, metavar="S",
                   help=f"learner wall time of one batch trained alone, barrier included [{PAPER_PRESET.learner_total_s}]")
    d.add_argument("--backward-sigma", type=nonneg_s, metavar="SIGMA",
                   help="lognormal spread of per-trajectory backward work, mean kept [0]")
    d.add_argument("--optimizer-s", type=nonneg_s, metavar="S", help=f"optimizer step [{PAPER_PRESET.optimizer_s}]")
    d.add_argument("--publish-s", type=nonneg_s, metavar="S", help=f"weight publish to the rollout [{PAPER_PRESET.publish_s}]")
    d.add_argument("--reduce-s", type=nonneg_s, metavar="S", help=f"gradient all-reduce at the barrier [{PAPER_PRESET.reduce_s}]")
    d.add_argument("--group-close-s", type=nonneg_s, metavar="S", help=f"one group close [{PAPER_PRESET.group_close_s}]")
    m = parser.add_argument_group("machine (also what-if overrides for --spans)")
    m.add_argument("--rollout-slots", type=pos_int, metavar="N",
                   help="concurrent trajectories in the rollout fleet [one per trajectory]")
    m.add_argument("--learner-ranks", type=pos_int, metavar="N", help=f"data-parallel learner ranks [{PAPER_PRESET.learner_ranks}]")
    m.add_argument("--engine-cost", metavar="FILE",
                   help="with --spans: simulate fully-async on a shared engine at these measured costs (the JSON "
                        "of python -m learner.bench.engine_cost; learner/sim/shared_engine.py) [recorded durations]")
    m.add_argument("--assign", choices=ASSIGN_POLICIES, default="group-affinity",
                   help="trajectory -> rank: its group's owner rank (the data-parallel learner's map), "
                        "the first free rank, or static sharding by index [group-affinity]")
    s = parser.add_argument_group("simulation")
    s.add_argument("--schedules", type=schedule_list, default=list(SCHEDULES), metavar="LIST",
                   help=f"comma list [{','.join(SCHEDULES)}]")
    s.add_argument("--steps", type=pos_int, default=10, metavar="N", help="optimizer steps to simulate [10]")
    s.add_argument("--warmup", type=nonneg_int, default=2, metavar="N", help="first steps left out of the summary [2]")
    s.add_argument("--max-staleness", type=nonneg_int, default=2, metavar="K", help="fully-async bound [2]")
    s.add_argument("--seed", type=nonneg_int, default=0, metavar="N", help="draws of the modelled workload [0]")
    o = parser.add_argument_group("output")
    o.add_argument("--json", metavar="FILE", help='write {"schedules": {...}, "inputs": {...}}')
    o.add_argument("--events", metavar="FILE",
                   help="simulated JSONL events (spans, metrics) per schedule: FILE.<schedule>.jsonl when several")


def _given(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    return {flag: getattr(args, flag[2:].replace("-", "_")) for flag in flags
            if getattr(args, flag[2:].replace("-", "_")) is not None}


def build_workload(args: argparse.Namespace) -> tuple[Workload, dict[str, Any]]:
    """The workload the flags describe, and the reference numbers to print beside it."""
    spec_given, shape_given = _given(args, SPEC_FLAGS), _given(args, SHAPE_FLAGS)
    engine = load_engine_cost(args.engine_cost) if args.engine_cost and args.spans else None
    if args.spans:
        if args.preset:
            raise SimInputError("--preset: cannot be combined with --spans (the recording is the workload)")
        if spec_given:
            flag = next(iter(spec_given))
            raise SimInputError(f"{flag}: cannot be combined with --spans (the recording fixes it)")
        workload = workload_from_spans(load_events(args.spans))
        if engine is not None:
            workload = with_shared_engine(workload, engine, shape_given.get("--rollout-slots"))
        workload.rollout_slots = shape_given.get("--rollout-slots", workload.rollout_slots)
        workload.learner_ranks = shape_given.get("--learner-ranks", workload.learner_ranks)
        measured = workload.inputs["measured_step_s"]
        schedule = workload.inputs["recorded_schedule"]
        ref = {}
        if measured and schedule:
            values = sorted(measured.values())
            ref = {schedule: values[len(values) // 2]}
        return workload, {"label": "measured", "step_s": ref}
    if args.engine_cost:
        raise SimInputError("--engine-cost: needs --spans (a drawn workload has no generate turns to share an engine)")
    values = {SPEC_FLAGS.get(f) or SHAPE_FLAGS[f]: v for f, v in {**spec_given, **shape_given}.items()}
    spec = with_overrides(PAPER_PRESET, **values)
    if "--rollout-sigma" in spec_given and spec.rollout_dist != "lognormal":
        raise SimInputError(f"--rollout-sigma: only shapes --rollout-dist lognormal, not {spec.rollout_dist}")
    workload = synthetic_workload(spec, args.steps, args.seed)
    if args.preset == "paper":
        workload.inputs["preset"] = "paper"
        workload.inputs["reference"] = PAPER_REFERENCE
        return workload, {"label": "paper", "step_s": PAPER_REFERENCE["step_s"]}
    return workload, {"label": "", "step_s": {}}


def load_engine_cost(path: str) -> EngineCost:
    """``--engine-cost``: the measured costs; errors name the flag, the file and the reason."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as err:
        raise SimInputError(f"--engine-cost: cannot read {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise SimInputError(f"--engine-cost: {path} is not JSON: {err.msg}") from None
    values = {}
    for key in ("a_s", "b_s", "join_s", "copy_s", "b_col_s", "prompt_width"):
        value = doc.get(key, None if key in ("a_s", "b_s", "join_s") else 0.0) if isinstance(doc, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise SimInputError(f"--engine-cost: {path} needs '{key}' as seconds >= 0, got {value!r}")
        values[key] = float(value)
    return EngineCost(**values)


def _secs(x: float) -> str:
    """0.1 s resolution for paper-scale steps, ms for the seconds-long steps of a CPU run."""
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3f}"


def format_table(results: dict[str, ScheduleResult], reference: dict[str, Any]) -> str:
    head = ["schedule", "step_s", "R rollout", "L learner", "bound", "eff", "speedup", "trainer idle",
            "rollout idle", "stale mean/max", "tail_s"]
    if reference["step_s"]:
        head.append(f"{reference['label']} step_s")
    rows = [head]
    for name, r in results.items():
        row = [name, _secs(r.step_s), _secs(r.rollout_s), _secs(r.learner_s), _secs(r.bound_s),
               f"{r.efficiency:.2f}", f"{r.speedup_vs_sync:.2f}x", f"{r.trainer_idle_ratio:.1%}",
               f"{r.rollouter_idle_ratio:.1%}", f"{r.staleness_mean:.2f}/{r.staleness_max}", _secs(r.tail_s)]
        if reference["step_s"]:
            ref = reference["step_s"].get(name)
            row.append(_secs(ref) if ref is not None else "-")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _events_path(path: str, schedule: str, several: bool) -> str:
    if not several:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{schedule}{p.suffix or '.jsonl'}"))


def run(args: argparse.Namespace) -> int:
    if args.warmup >= args.steps:
        print(f"thundersync simulate: error: --warmup: must be smaller than --steps ({args.steps}), got {args.warmup}",
              file=sys.stderr)
        return 2
    try:
        workload, reference = build_workload(args)
    except SimInputError as err:
        print(f"thundersync simulate: error: {err}", file=sys.stderr)
        return 2
    settings = {"steps": args.steps, "warmup": args.warmup, "max_staleness": args.max_staleness, "assign": args.assign}
    results = simulate_all(workload, args.schedules, **settings)
    print(format_table(results, reference))
    doc = report(workload, results, **settings)
    if args.json and not _write(args.json, "--json", lambda fh: fh.write(json.dumps(doc, indent=2) + "\n")):
        return 2
    for name, result in results.items() if args.events else ():
        path = _events_path(args.events, name, len(results) > 1)
        if not _write(path, "--events", lambda fh: [fh.write(json.dumps(e, separators=(",", ":")) + "\n")
                                                    for e in simulated_events(result, doc["inputs"])]):
            return 2
    return 0


def _write(path: str, flag: str, write) -> bool:
    try:
        with open(path, "w") as fh:
            write(fh)
    except OSError as err:
        print(f"thundersync simulate: error: {flag}: cannot write {path}: {err.strerror}", file=sys.stderr)
        return False
    return True
