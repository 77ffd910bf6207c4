"""Overhead of data-parallel learner ranks on this machine: the same run with W = 1 and W = 2,
alternating, measured side by side (docs/distributed.md).

    .venv/bin/python -m bench.decisions.data_parallel_overhead [--steps 6] [--rounds 2] [--json out.json]

Per run: median step time, learner busy time per step, and the barrier's cost (the
``learner.optimizer`` span on rank 0: the integer all-reduce, the gradient reduction, clipping,
the optimizer step and the rank checks) and the publish span, over the steps after the first.
On a 2-core machine W = 2 ranks time-slice with each other and with the rollout worker: this
measures the cost of the machinery, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from bench.load_report import finish
from learner.timeline import Kind

ROOT = Path(__file__).resolve().parents[2]


def run_once(world: int, steps: int, engine: str, tmp: Path) -> dict:
    cfg = yaml.safe_load((ROOT / "configs/quickstart.yaml").read_text())
    cfg["train"].update(steps=steps, prompts_per_step=8)
    cfg["learner"] = {"world_size": world, "engine": engine}
    path, ev = tmp / f"w{world}-{engine}.yaml", tmp / f"w{world}-{engine}.jsonl"
    path.write_text(yaml.safe_dump(cfg))
    subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(path), "--events", str(ev),
                    "--quiet"], check=True, cwd=ROOT, timeout=1800)
    events = [json.loads(line) for line in ev.read_text().splitlines()]
    metrics = [e["values"] for e in events if e["type"] == "metrics"][1:]
    spans = [e for e in events if e["type"] == "span" and e["lane"] == "learner/0" and e["step"] > 0]

    def median_of(kind: str) -> float:
        return statistics.median(s["t1"] - s["t0"] for s in spans if s["kind"] == kind)

    return {"world_size": world, "engine": engine,
            "step_s": statistics.median(m["timing_s/step"] for m in metrics),
            "learner_s": statistics.median(m["timing_s/learner"] for m in metrics),
            "barrier_s": median_of(Kind.OPTIMIZER), "publish_s": median_of(Kind.PUBLISH)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engines", default="torch")
    parser.add_argument("--json")
    args = parser.parse_args()
    out: dict = {"load_start": os.getloadavg()[0], "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for engine in args.engines.split(","):
                for world in (1, 2):
                    row = run_once(world, args.steps, engine, Path(tmp))
                    out["runs"].append(row)
                    print(json.dumps(row), flush=True)
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
