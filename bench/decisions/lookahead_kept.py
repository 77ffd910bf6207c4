"""Kept-token share by how far ahead a draft was started (docs/speculation.md, "Lookahead"):
``thundersync train`` with ``rollout.speculation.lookahead`` 1, 2, ... alternated per round;
per run the step metrics ``speculation/kept_token_share_ahead_1`` / ``_2plus`` (drafts whose first
turn was drafted 1 / 2+ steps before their step) weighted by their drafted tokens, and the
current step's rollout time (``step/last_reward_t - step/t_start``, steps 1..).

    .venv/bin/python -m bench.decisions.lookahead_kept [--config configs/bench.yaml] [--lookaheads 1 2]
        [--steps 6] [--rounds 2]
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

from learner.timeline import Metric


def run(config: dict, steps: int, schedule: str, workdir: Path) -> list[dict]:
    path, events = workdir / "config.yaml", workdir / "events.jsonl"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path), "--steps", str(steps),
                           "--schedule", schedule, "--events", str(events), "--quiet"], timeout=1800,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"thundersync train failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return [e["values"] for e in map(json.loads, events.read_text().splitlines()) if e.get("type") == "metrics"]


def summary(steps: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in ("1", "2plus"):
        tokens = sum(v.get(Metric.DRAFTED_AHEAD + name, 0.0) for v in steps)
        kept = sum(v.get(Metric.DRAFTED_AHEAD + name, 0.0) * v.get(Metric.KEPT_SHARE_AHEAD + name, 0.0) for v in steps)
        out[f"drafted_{name}"], out[f"kept_{name}"] = tokens, kept / tokens if tokens else float("nan")
    drafted = sum(v.get(Metric.DRAFTED_TOKENS, 0.0) for v in steps)
    out["kept_all"] = sum(v.get(Metric.DRAFTED_TOKENS, 0.0) * v.get(Metric.KEPT_TOKEN_SHARE, 0.0)
                          for v in steps) / drafted if drafted else float("nan")
    out["rollout_s"] = statistics.median(v[Metric.LAST_REWARD_T] - v[Metric.T_START] for v in steps)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench.yaml")
    parser.add_argument("--schedule", default="sync")
    parser.add_argument("--lookaheads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    steps: dict[int, list[dict]] = {k: [] for k in args.lookaheads}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for k in args.lookaheads:
                spec = {"enabled": True, "lookahead": k}
                config = {**base, "rollout": {**base.get("rollout", {}), "speculation": spec}}
                steps[k] += run(config, args.steps, args.schedule, Path(tmp))[1:]  # step 0 has no drafts
    for k, s in steps.items():
        m = summary(s)
        print(f"lookahead {k}: kept {m['kept_all']:.3f} overall; 1 ahead {m['kept_1']:.3f} of {m['drafted_1']:.0f} "
              f"tokens; 2+ ahead {m['kept_2plus']:.3f} of {m['drafted_2plus']:.0f} tokens; "
              f"current-step rollout median {m['rollout_s']:.3f} s")


if __name__ == "__main__":
    main()
