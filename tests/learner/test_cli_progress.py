"""`thundersync train`'s progress bar (tqdm): a resumed run's bar starts at its first step and ends
at 100%, not at "23% 7/30"."""

import io

from tqdm import tqdm

from learner.cli import bar_to_step


def rendered(out: io.StringIO) -> list[str]:
    return [part.strip() for part in out.getvalue().replace("\r", "\n").splitlines() if part.strip()]


def test_a_resumed_runs_bar_starts_at_the_resumed_step_and_ends_at_100_percent():
    out = io.StringIO()
    bar = tqdm(total=30, file=out, mininterval=0, ascii=True)
    for step in range(7, 30):  # resumed after the checkpoint of step 6
        bar_to_step(bar, step)
    bar.close()
    lines = rendered(out)
    assert "8/30" in lines[1] and "100%" in lines[-1] and "30/30" in lines[-1], lines[:2] + lines[-1:]
    assert not any(" 1/30" in line for line in lines)


def test_a_fresh_runs_bar_counts_from_zero():
    out = io.StringIO()
    bar = tqdm(total=5, file=out, mininterval=0, ascii=True)
    for step in range(5):
        bar_to_step(bar, step)
    bar.close()
    lines = rendered(out)
    assert "1/5" in lines[1] and "100%" in lines[-1] and "5/5" in lines[-1], lines
