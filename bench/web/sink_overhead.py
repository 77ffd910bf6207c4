"""Does live event streaming slow the learner? Streaming step time with three event sinks, side by side.

Arms, alternating in each repeat, same config and seed:
  memory    events kept in a list (no serialising, no I/O): the floor
  waits     JsonlSink writing only in the learner's waits for the rollout fleet (no flusher thread)
  live      JsonlSink as `thundersync train --events` uses it: waits + a flusher thread for events
            30 ms old (learner/timeline.py)
Reported per arm: median step time (timing_s/step), median learner time per step
(timing_s/learner), and the events' hold (write time - span end) for the JSONL arms.

    .venv/bin/python -m bench.web.sink_overhead [--repeats 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from learner.timeline import Kind

ARMS = ("memory", "waits", "live")


class TimedFile:
    """A file that stamps each written line's spans with the write time."""

    def __init__(self, path: str):
        self.fh, self.holds, self.origin = open(path, "w"), [], None

    def write(self, text: str) -> None:
        now = time.time()
        for line in text.splitlines():
            event = json.loads(line)
            if event["type"] == "run" and event.get("status") == "started":
                self.origin = event["origin_epoch"]
            elif event["type"] == "span" and self.origin and event["kind"] != Kind.TOOL:
                self.holds.append(1000 * (now - self.origin - event["t1"]))
        self.fh.write(text)

    def flush(self) -> None:
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def one_run(arm: str, cfg, out_dir: str) -> dict:
    from learner.driver.loop import train
    from learner.timeline import JsonlSink, MemorySink

    if arm == "memory":
        sink = MemorySink()
        timed = None
    else:
        sink = JsonlSink(os.path.join(out_dir, f"{arm}.jsonl"), max_delay_s=None if arm == "waits" else JsonlSink.MAX_DELAY_S)
        sink._fh = timed = TimedFile(os.path.join(out_dir, f"{arm}.timed.jsonl"))
    metrics = []
    try:
        train(cfg, sink, on_step=metrics.append)
    finally:
        sink.close()
    steps = metrics[1:]  # the first step includes the engines' warm-up
    return {"step_s": statistics.median(m["timing_s/step"] for m in steps),
            "learner_s": statistics.median(m["timing_s/learner"] for m in steps),
            "holds": timed.holds if timed else []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    from learner.config import load_config

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "configs" / "quickstart.yaml", {
        "train.steps": args.steps, "train.prompts_per_step": args.prompts, "train.schedule": "streaming"})
    results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    loads = []
    with tempfile.TemporaryDirectory() as out_dir:
        for r in range(args.repeats):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                results[arm].append(one_run(arm, cfg, out_dir))
                loads.append(os.getloadavg()[0])
    print(f"streaming, {args.steps} steps x {args.prompts} prompts x {cfg.train.group_size}, {args.repeats} repeats "
          f"per arm (alternating); load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs")
    floor = statistics.median(x["step_s"] for x in results["memory"])
    for arm in ARMS:
        step = statistics.median(x["step_s"] for x in results[arm])
        learner = statistics.median(x["learner_s"] for x in results[arm])
        holds = [h for x in results[arm] for h in x["holds"]]
        hold = (f", span end -> written p50 {statistics.median(holds):.0f} ms, "
                f"p95 {statistics.quantiles(holds, n=20)[18]:.0f} ms") if holds else ""
        each = ", ".join(f"{x['step_s']:.3f}" for x in results[arm])
        print(f"  {arm:7s} step {step:.3f} s ({step / floor:.3f}x memory), learner {learner:.3f} s/step{hold}; "
              f"per repeat: {each}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
