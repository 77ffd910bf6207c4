"""The tail every learner measurement script shares: the load beside the numbers, the JSON out."""

from __future__ import annotations

import json
import os
from pathlib import Path


def finish(out: dict, json_path: str | None) -> int:
    """Record the load average at the end (the machine is shared: read numbers beside it), print
    it and write ``out`` to ``json_path`` if given."""
    out["load_end"] = os.getloadavg()[0]
    print(f"load average {out['load_start']:.1f} -> {out['load_end']:.1f}")
    if json_path:
        Path(json_path).write_text(json.dumps(out, indent=1))
    return 0
