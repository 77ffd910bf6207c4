"""What the live events flusher costs the driver: CPU of a process emitting spans at a streaming
step's rate through ``JsonlSink``, with its flusher thread vs written once at close.

    .venv/bin/python -m bench.web.flusher_cpu [--rate 1540] [--seconds 6] [--pairs 3]

The emitting thread sleeps between events (the learner's torch work releases the GIL), so the
process CPU is the sink's: ``emit`` (queueing), the flusher's wake-ups every ``max_delay_s / 2``,
its lock hand-offs and chunked writes (arm ``live``), against the same events written in one go
at close (arm ``at-close``). Alternating pairs; the load average is printed beside the numbers.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from learner.timeline import JsonlSink

SPAN = {"type": "span", "kind": "rollout.generate", "t0": 1.0, "t1": 2.0, "traj": 3, "group": 1, "worker": 0,
        "step": 2, "seq": 1}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_run(path: Path, live: bool, rate: float, seconds: float) -> float:
    """Share of one core the process used while emitting ``rate`` spans a second for ``seconds``."""
    sink = JsonlSink(str(path), max_delay_s=JsonlSink.MAX_DELAY_S if live else None)
    c0, t0 = _cpu_s(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        time.sleep(1.0 / rate)
        sink.emit(dict(SPAN))
    sink.close()
    return (_cpu_s() - c0) / seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=1540.0, help="spans per second (~770 in a 0.5 s streaming step)")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    shares: dict[str, list[float]] = {"live": [], "at-close": []}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="thundersync-flusher-") as tmp:
        for r in range(args.pairs):
            for arm in ("live", "at-close") if r % 2 == 0 else ("at-close", "live"):
                shares[arm].append(one_run(Path(tmp) / f"{arm}-{r}.jsonl", arm == "live", args.rate, args.seconds))
    for arm, values in shares.items():
        print(f"{arm:9} CPU {100 * statistics.median(values):.2f}% of a core (per run: "
              f"{', '.join(f'{100 * v:.2f}' for v in values)})")
    extra = statistics.median(a - b for a, b in zip(shares["live"], shares["at-close"]))
    print(f"flusher: {100 * extra:.2f}% of a core at {args.rate:.0f} spans/s, "
          f"{1000 * extra * 770 / args.rate:.1f} ms of CPU per 770 spans; load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
