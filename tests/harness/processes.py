"""Processes of a `thundersync train` run as the fault tests see them (only /proc)."""

from __future__ import annotations

from pathlib import Path


def rollout_workers(driver: int) -> list[int]:
    """The driver's rollout worker processes: its children started by multiprocessing's spawn
    (its resource tracker, also a child, is not one)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[1]) == driver and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found
