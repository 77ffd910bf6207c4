"""Does recording every trajectory's text slow a run? Quickstart step times with the trajectory
records on vs off (``TrajectoryRecords.submit`` a no-op), alternating in each repeat, same config
and seed; and the decoding time of one step's records on the background thread.

    .venv/bin/python -m bench.decisions.trajectory_records_overhead [--repeats 3] [--steps 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from unittest import mock

from learner.config import load_config
from learner.driver import trajectory_records
from learner.driver.loop import train
from learner.timeline import MemorySink, Metric


def one_run(steps: int, records: bool) -> tuple[list[float], list[float]]:
    """Step times (the first step left out: warm-up) and per-step decode seconds."""
    cfg = load_config("configs/quickstart.yaml", {"train.steps": steps})
    decode_s: list[float] = []
    real = trajectory_records.trajectory_events

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        events = real(*args, **kwargs)
        decode_s.append(time.perf_counter() - t0)
        return events

    sink = MemorySink()
    if records:
        with mock.patch.object(trajectory_records, "trajectory_events", timed):
            train(cfg, sink)
    else:
        with mock.patch.object(trajectory_records.TrajectoryRecords, "submit", lambda self, step, trajs: None):
            train(cfg, sink)
    steps_s = [e["values"][Metric.STEP_S] for e in sink.events if e["type"] == "metrics"][1:]
    return steps_s, decode_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    arms: dict[bool, list[float]] = {True: [], False: []}
    decode: list[float] = []
    loads = []
    for _ in range(args.repeats):
        for records in (False, True):
            loads.append(os.getloadavg()[0])
            steps_s, decode_s = one_run(args.steps, records)
            arms[records] += steps_s
            decode += decode_s
    off, on = statistics.median(arms[False]), statistics.median(arms[True])
    print(f"median step: records off {off * 1e3:.1f} ms, on {on * 1e3:.1f} ms (ratio {on / off:.3f}; "
          f"{len(arms[True])} steps each); decoding one step's records: median {statistics.median(decode) * 1e3:.2f} ms "
          f"on the background thread; load average {min(loads):.1f}-{max(loads):.1f}")


if __name__ == "__main__":
    main()
