"""The current step's own rollout time with drafting on vs off (docs/speculation.md): per step,
from its start (the dispatch, under sync) to its last trajectory's reward
(``step/last_reward_t - step/t_start``), over steps 1.. (step 0 has no drafts).

    .venv/bin/python -m bench.decisions.draft_rollout_time [--config configs/bench.yaml] [--steps 5] [--rounds 2]
        [--switch enabled|reuse_verified_kv] [--preamble N]

Runs ``thundersync train`` with ``rollout.speculation.enabled`` off and on (``--switch
reuse_verified_kv``: speculation on, with ``reuse_verified_kv`` off and on: remainders prefill
their context again, or start from verification's keys/values), alternated, ``--rounds`` times
(``--preamble N``: ``task.prompt_preamble`` of N characters, so contexts pass the prefix store's
threshold); prints the median per arm over all rounds' steps and the on/off ratio, and where the
current step's loops waited: per step, the seconds from a loop's modelled tool wait ending to
its next turn starting (summed over loops), and of those the part while the engine ran a draft
(``rollout.draft``) or a verification forward (``rollout.draft_verify``); and the engine's busy
seconds per step (its generate, draft and verification calls, start of a step to the next's),
and per step (medians) ``speculation/verify_s``, ``remainder_tokens`` and ``verified_kv_tokens``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from learner.driver.speculation_metrics import busy_share
from learner.timeline import Kind, Metric, union_length


SPEC_METRICS = (Metric.VERIFY_S, Metric.REMAINDER_TOKENS, Metric.VERIFIED_KV_TOKENS)
PREAMBLE = "Use the calculator tool for every operation, one operation per call. "


def rollout_times(config: dict, steps: int, schedule: str,
                  workdir: Path) -> tuple[list[float], list[list[float]], list[float], list[int], list[dict]]:
    """Per step 1..: the current step's rollout time, its waits (``waits``), and the engine's busy
    seconds from its start to the next step's (``rollouter/busy_share`` x that window: drafts and
    verification included; the last step has none), the draft turns resumed after a cut in
    that window (``_resumed_drafts``), and its ``SPEC_METRICS`` (those it has)."""
    path, events = workdir / "config.yaml", workdir / "events.jsonl"
    path.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path), "--steps", str(steps),
                    "--schedule", schedule, "--events", str(events), "--quiet"], check=True, timeout=1800)
    log = [json.loads(line) for line in events.read_text().splitlines()]
    values = [e["values"] for e in log if e.get("type") == "metrics" and Metric.LAST_REWARD_T in e["values"]][1:]
    spans = [e for e in log if e.get("type") == "span"]
    resumed = _resumed_drafts(spans)
    workers = config.get("rollout", {}).get("workers", 1)
    busy = [busy_share(spans, a[Metric.T_START], b[Metric.T_START], workers) * (b[Metric.T_START] - a[Metric.T_START])
            * workers for a, b in zip(values, values[1:])]
    resumes = [sum(a[Metric.T_START] <= t < b[Metric.T_START] for t in resumed) for a, b in zip(values, values[1:])]
    return ([v[Metric.LAST_REWARD_T] - v[Metric.T_START] for v in values],
            [waits(spans, v[Metric.T_START], v[Metric.LAST_REWARD_T]) for v in values], busy, resumes,
            [{k: v[k] for k in SPEC_METRICS if k in v} for v in values])


def _resumed_drafts(spans: list[dict]) -> list[float]:
    """When each draft turn resumed after a cut: a ``rollout.draft`` span of a (trajectory, turn)
    that already had one (a cut ends a span, its resume starts the next)."""
    seen, out = set(), []
    for s in sorted((s for s in spans if s["kind"] == Kind.DRAFT), key=lambda s: s["t0"]):
        if (s["traj"], s["turn"]) in seen:
            out.append(s["t0"])
        seen.add((s["traj"], s["turn"]))
    return out


def waits(spans: list[dict], t0: float, t1: float) -> list[float]:
    """[waited, of it while a draft ran, of it while a verification forward ran] (seconds, summed
    over the loops whose tool wait ended in [t0, t1])."""
    by_traj: dict[int, list[dict]] = {}
    for s in spans:
        if s["kind"] in (Kind.TOOL_WAIT, Kind.GENERATE):
            by_traj.setdefault(s["traj"], []).append(s)
    busy = {k: [(s["t0"], s["t1"]) for s in spans if s["kind"] == k] for k in (Kind.DRAFT, Kind.DRAFT_VERIFY)}
    out = [0.0, 0.0, 0.0]
    for seq in by_traj.values():
        seq.sort(key=lambda s: s["t0"])
        for a, b in zip(seq, seq[1:]):
            if a["kind"] == Kind.TOOL_WAIT and b["kind"] == Kind.GENERATE and t0 <= a["t1"] <= t1:
                out[0] += b["t0"] - a["t1"]
                out[1] += union_length(busy[Kind.DRAFT], a["t1"], b["t0"])
                out[2] += union_length(busy[Kind.DRAFT_VERIFY], a["t1"], b["t0"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench.yaml")
    parser.add_argument("--schedule", default="sync")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--switch", choices=["enabled", "reuse_verified_kv"], default="enabled",
                        help="the rollout.speculation field the arms set false (off) and true (on)")
    parser.add_argument("--preamble", type=int, default=0, help="task.prompt_preamble of this many characters")
    args = parser.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    if args.preamble:
        base["task"] = {**base.get("task", {}), "prompt_preamble": (PREAMBLE * args.preamble)[:args.preamble]}
    times: dict[str, list[float]] = {"off": [], "on": []}
    waited: dict[str, list[list[float]]] = {"off": [], "on": []}
    busy: dict[str, list[float]] = {"off": [], "on": []}
    resumes: dict[str, list[int]] = {"off": [], "on": []}
    spec: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for arm in times:
                switch = {"enabled": True, args.switch: arm == "on"}
                config = {**base, "rollout": {**base.get("rollout", {}), "speculation": switch}}
                t, w, b, r, m = rollout_times(config, args.steps, args.schedule, Path(tmp))
                resumes[arm] += r
                spec[arm] += m
                times[arm] += t
                waited[arm] += w
                busy[arm] += b
    for arm, t in times.items():
        w = [statistics.median(x[i] for x in waited[arm]) for i in range(3)]
        print(f"{arm:4s} current-step rollout s: median {statistics.median(t):.3f} over {len(t)} steps "
              f"({', '.join(f'{x:.2f}' for x in t)}); loops waited {w[0]:.3f} s per step (median), "
              f"{w[1]:.3f} s of it behind drafts, {w[2]:.3f} s behind verification; engine busy "
              f"{statistics.median(busy[arm]) if busy[arm] else float('nan'):.3f} s per step (median), "
              f"{sum(resumes[arm])} draft turns resumed after a cut in {len(resumes[arm])} steps")
        medians = {k: statistics.median(m[k] for m in spec[arm] if k in m) for k in SPEC_METRICS
                   if any(k in m for m in spec[arm])}
        if medians:
            print("     per step (median): " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
    print(f"on / off: {statistics.median(times['on']) / statistics.median(times['off']):.3f}")


if __name__ == "__main__":
    main()
