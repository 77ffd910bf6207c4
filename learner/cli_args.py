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


def int_list(lo: int, hi: int):
    """A comma list of integers in [lo, hi], duplicates dropped, order kept."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(s) for s in text.split(",") if s.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}")
        if not values or any(not lo <= v <= hi for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma list of integers in {lo}..{hi}, got {text!r}")
        return list(dict.fromkeys(values))
    return parse


def choice_list(choices: tuple[str, ...]):
    """A comma list of names out of ``choices``, duplicates dropped, order kept."""
    def parse(text: str) -> list[str]:
        names = [s.strip() for s in text.split(",") if s.strip()]
        if not names or any(n not in choices for n in names):
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(choices)}, got {text!r}")
        return list(dict.fromkeys(names))
    return parse


# sync,streaming,...: a comma list of schedule names
schedule_list = choice_list(SCHEDULES)
