"""The current step's own rollout time with drafting on vs off (docs/speculation.md): per step,
from its start (the dispatch, under sync) to its last trajectory's reward
(``step/last_reward_t - step/t_start``), over steps 1.. (step 0 has no drafts).

    .venv/bin/python -m bench.draft_rollout_time [--config configs/bench.yaml] [--steps 5] [--rounds 2]

Runs ``thundersync train`` with ``rollout.speculation.enabled`` off and on, alternated, ``--rounds``
times; prints the median per arm over all rounds' steps and the on/off ratio.
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


def rollout_times(config: dict, steps: int, schedule: str, workdir: Path) -> list[float]:
    path, events = workdir / "config.yaml", workdir / "events.jsonl"
    path.write_text(yaml.safe_dump(config))
    subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path), "--steps", str(steps),
                    "--schedule", schedule, "--events", str(events), "--quiet"], check=True, timeout=1800)
    values = [e["values"] for e in map(json.loads, events.read_text().splitlines()) if e.get("type") == "metrics"]
    return [v[Metric.LAST_REWARD_T] - v[Metric.T_START] for v in values if Metric.LAST_REWARD_T in v][1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/bench.yaml")
    parser.add_argument("--schedule", default="sync")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base = yaml.safe_load(Path(args.config).read_text())
    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for arm in times:
                config = {**base, "rollout": {**base.get("rollout", {}), "speculation": {"enabled": arm == "on"}}}
                times[arm] += rollout_times(config, args.steps, args.schedule, Path(tmp))
    for arm, t in times.items():
        print(f"{arm:4s} current-step rollout s: median {statistics.median(t):.3f} over {len(t)} steps "
              f"({', '.join(f'{x:.2f}' for x in t)})")
    print(f"on / off: {statistics.median(times['on']) / statistics.median(times['off']):.3f}")


if __name__ == "__main__":
    main()
