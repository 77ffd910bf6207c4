"""Whether a comparison of runs is fair, and which runs "Compare latest" picks.

A ratio of two runs' step times means something only when the runs trained the same config
for the same steps with the same seed, differing in the schedule alone, and both ran to the
end with enough steps for a median. ``warnings`` names every way a set of runs falls short;
``comparable_latest`` picks the newest set of runs that does not.
"""

from __future__ import annotations

from typing import Any

from controller.config_merge import flatten
from controller.models import Run
from learner.registries.schedules import schedule_kind

MIN_STEPS = 3  # fewer finished steps give no step-time median worth a ratio
MAX_PICKED = 4
# Config paths a schedule preset sets besides the schedule kind are the preset's knobs; these
# are the paths every run differs in by design (its name) or that are reported on their own.
OWN_PATHS = {"name", "train.schedule", "train.steps", "seed"}


def config_diff(runs: list[Run]) -> list[dict]:
    """Config paths whose values differ between the runs, with each run's value."""
    flat = [flatten(r.config) for r in runs]
    paths = sorted({p for f in flat for p in f})
    rows = [{"path": p, "values": [f.get(p) for f in flat]} for p in paths]
    return [row for row in rows if any(v != row["values"][0] for v in row["values"])]


def schedule_paths(runs: list[Run]) -> set[str]:
    """Every config path the runs' schedule presets set (their knobs): differences there are the
    point of the comparison."""
    return {p for r in runs for p in r.schedule.overrides()}


def train_value(run: Run, key: str) -> Any:
    return run.config.get("train", {}).get(key)


def _listing(runs: list[Run], values: list[Any]) -> str:
    return ", ".join(f"{r} {v}" for r, v in zip(runs, values))


def warnings(runs: list[Run], steps_done: dict[int, int]) -> list[str]:
    """What makes a ratio between ``runs`` unfair (empty: nothing). ``steps_done``: run id ->
    steps with stored metrics."""
    found = []
    for r in runs:
        if r.status != Run.Status.SUCCEEDED:
            found.append(f"{r} is {r.status}: its figures cover {steps_done[r.pk]} of {r.steps} steps.")
    steps = [train_value(r, "steps") for r in runs]
    if len(set(steps)) > 1:
        found.append(f"Different step counts ({_listing(runs, steps)}): medians over different phases of training.")
    seeds = [r.config.get("seed") for r in runs]
    if len(set(seeds)) > 1 and not all(r.round_seed() is not None for r in runs):  # repeats across seeds
        found.append(f"Different seeds ({_listing(runs, seeds)}): the runs saw different prompts and samples.")
    allowed = OWN_PATHS | schedule_paths(runs)
    other = [row["path"] for row in config_diff(runs) if row["path"] not in allowed]
    launched = {p for r in runs for p in r.launch_overrides()}  # set at launch: a sweep's field, an override
    if all(r.round_seed() is not None for r in runs):
        other = [p for p in other if p != "seed"]  # the rounds' seeds: repeats drawn across seeds
    swept = [p for p in other if p in launched]
    if swept:
        found.append(f"Launched with different overrides ({', '.join(swept[:5])}): a ratio between these runs "
                     "measures the field as well as the schedule.")
    other = [p for p in other if p not in launched]
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        found.append(f"The configs differ beyond the schedule: {shown}.")
    short = [r for r in runs if steps_done[r.pk] < MIN_STEPS]
    if short:
        found.append(f"Too few steps to measure ({_listing(short, [steps_done[r.pk] for r in short])} steps; "
                     f"at least {MIN_STEPS} for a median).")
    if shared_schedule(runs):
        found.append("Two runs share a schedule: the comparison is between repeats, not schedules.")
    return found


def shared_schedule(runs: list[Run]) -> bool:
    """Two runs of one schedule and the same overrides, other than one comparison's repeats
    (which its summary pools: controller/comparisons/pooled.py)."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.schedule.kind, repr(sorted(r.launch_overrides().items()))), []).append(r)

    def repeats(members: list[Run]) -> bool:
        first = members[0]
        return (len({r.comparison_id for r in members}) == 1 and first.comparison_id is not None
                and first.comparison.repeats > 1)

    return any(len(members) > 1 and not repeats(members) for members in groups.values())


def fair_key(run: Run, knobs: set[str]) -> tuple:
    """Runs with the same key differ in their schedule only: ``knobs``, the paths any of the
    candidates' presets sets, are left out of every run's key (fully-async's preset sets
    train.max_staleness, which a sync run holds at its default: leaving it out of fully-async's
    key alone set it apart from every other run), and the launch overrides are kept in."""
    flat = flatten(run.config)
    kept = {p: v for p, v in flat.items() if p not in OWN_PATHS | (knobs - set(run.overrides))}
    return run.experiment_id, train_value(run, "steps"), run.config.get("seed"), repr(sorted(kept.items()))


def comparable_latest(runs: list[Run], steps_done: dict[int, int]) -> tuple[list[Run], str]:
    """The newest finished runs of one experiment that can be compared fairly: one per schedule
    kind (the newest), all succeeded with every step done, same steps, seed and config beyond
    the schedule; the group whose newest run is newest wins. Returns (runs oldest-kind order
    with sync first, "") or ([], why none)."""
    complete = [r for r in runs if r.status == Run.Status.SUCCEEDED and steps_done.get(r.pk, 0) >= r.steps]
    if not complete:
        return [], "No run has finished all its steps yet."
    groups: dict[tuple, dict[str, Run]] = {}
    knobs = schedule_paths(complete)
    for r in sorted(complete, key=lambda r: r.created, reverse=True):
        groups.setdefault(fair_key(r, knobs), {}).setdefault(r.schedule.kind, r)
    for group in groups.values():  # dicts keep insertion order: newest group first
        picked = [r for r in group.values() if steps_done[r.pk] >= MIN_STEPS]
        if len(picked) >= 2:
            picked.sort(key=lambda r: (not schedule_kind(r.schedule.kind).baseline, r.created))
            return picked[:MAX_PICKED], ""
    if all(steps_done[r.pk] < MIN_STEPS for r in complete):
        return [], f"Every finished run has fewer than {MIN_STEPS} steps: too few to measure."
    return [], ("No two finished runs of different schedules share steps, seed and config: "
                "launch a comparison to get one.")
