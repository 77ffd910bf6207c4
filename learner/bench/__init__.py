"""``thundersync bench``: the schedules measured side by side (docs/bench.md)."""
