"""argparse types shared by the ``thundersync`` subcommands; argparse names the flag on error."""

from __future__ import annotations

import argparse

from learner.config import SCHEDULES


def number(kind: type, lo: float, strict: bool = False):
    """A number of ``kind`` that is >= lo (> lo if ``strict``)."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if value < lo or (strict and value == lo):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {lo:g}, got {text}")
        return value
    return parse


def schedule_list(text: str) -> list[str]:
    """A comma list of schedule names, duplicates dropped, order kept."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in SCHEDULES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(SCHEDULES)}, got {text!r}")
    return list(dict.fromkeys(names))
