"""A run's directory and the learner's log in it (``learner.stderr.log``: progress lines, boot
phases, warnings, tracebacks). The supervisor appends to it and numbers each line; pages get
the last lines on connect and new ones live (``{"type": "log", "first": n, "lines": [...]}``,
line ``first`` being the file's line number n, from 0), and the whole file as a download."""

from pathlib import Path

from django.conf import settings

LOG_NAME = "learner.stderr.log"
TAIL_LINES = 200  # sent on (re)connect; the page keeps as many


def run_dir(run_id: int) -> Path:
    return Path(settings.THUNDERSYNC_RUN_DIR) / f"run-{run_id}"


def log_path(run_id: int) -> Path:
    return run_dir(run_id) / LOG_NAME


def readable_log(path: Path) -> bool:
    """A regular file (never read a device such as /dev/full: it has no end)."""
    return path.is_file()


def count_lines(path: Path) -> int:
    """Lines already in the file (a resumed run appends to its log)."""
    try:
        if not readable_log(path):
            return 0
        with open(path, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def log_tail(run_id: int, n: int = TAIL_LINES) -> tuple[int, list[str]]:
    """(number of the first line returned, the last ``n`` complete lines) of the run's log."""
    path = log_path(run_id)
    try:
        text = path.read_text(errors="replace") if readable_log(path) else ""
    except OSError:
        return 0, []
    lines = text.split("\n")[:-1]  # a line still being written has no newline yet
    return max(0, len(lines) - n), lines[-n:]
