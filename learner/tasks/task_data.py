"""Rows of a ``dataset`` task: loading JSONL/Parquet/CSV files and ``datasets`` directories,
checking the prompt and answer fields, the train/eval split and the per-seed epoch order.

Every problem with the data is a ``TaskDataError`` whose message names the file, the row
(1-based; for JSONL and CSV the line) and the field, e.g.
``task.path: math.jsonl line 3: field 'question' (task.prompt_field) is missing``.
With ``task.on_bad_data: score-zero`` a bad row is skipped instead and counted
(``DataRows.skipped``; the first few reasons are kept for the log), except an empty file or
one with no usable row, which is always an error. docs/tasks.md describes the formats.
"""

from __future__ import annotations

import csv
import io
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from learner.config import TaskConfig

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # where configs/ and its example data ship
KEPT_REASONS = 5


class TaskDataError(ValueError):
    """Data a task cannot use; the message names the file, row and field."""


@dataclass
class Row:
    where: str  # "math.jsonl line 3": the file and its 1-based row (JSONL/CSV: the line), for messages
    prompt: str
    answer: str | None  # None: missing and on_bad_data is score-zero (the trajectory scores 0)
    record: dict[str, Any]


@dataclass
class DataRows:
    train: list[Row]
    eval: list[Row]
    skipped: int = 0  # rows dropped under on_bad_data: score-zero
    reasons: list[str] = field(default_factory=list)  # the first few skip reasons


def resolve_path(spec: str) -> Path:
    """``task.path`` as given (absolute, or relative to the working directory), else relative
    to the project root, so the example configs find the data shipped beside them from any
    working directory (the web app runs each learner in its run directory)."""
    path = Path(spec).expanduser()
    if path.exists() or path.is_absolute():
        return path
    shipped = PROJECT_ROOT / path
    return shipped if shipped.exists() else path


def detect_format(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    if path.is_dir():
        return "hf-disk"
    suffix = path.suffix.lower()
    known = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".csv": "csv"}
    if suffix not in known:
        raise TaskDataError(f"task.path: cannot tell the format of {path.name} (use .jsonl, .parquet, .csv, "
                            "a datasets directory, or set task.format)")
    return known[suffix]


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TaskDataError(f"task.path: {where}: not valid UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start})") from None


def _jsonl_records(path: Path) -> list[tuple[int, dict | str]]:
    """(line number, record or the reason it is unusable) for each non-blank line."""
    out: list[tuple[int, dict | str]] = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                text = _decode(raw, f"{path.name} line {number}")
                record = json.loads(text)
            except TaskDataError as err:
                out.append((number, str(err)))
                continue
            except json.JSONDecodeError as err:
                out.append((number, f"task.path: {path.name} line {number}: not valid JSON ({err.msg} at column {err.colno})"))
                continue
            if not isinstance(record, dict):
                out.append((number, f"task.path: {path.name} line {number}: expected a JSON object, got {type(record).__name__}"))
                continue
            out.append((number, record))
    return out


def _csv_records(path: Path) -> list[tuple[int, dict | str]]:
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, start=1):  # name the line of a bad byte, not the whole file
        _decode(line, f"{path.name} line {number}")
    reader = csv.DictReader(io.StringIO(raw.decode("utf-8"), newline=""))
    out: list[tuple[int, dict | str]] = []
    for record in reader:
        out.append((reader.line_num, {k: v for k, v in record.items() if k is not None}))
    return out


def _table_records(path: Path, fmt: str) -> list[tuple[int, dict | str]]:
    """Parquet files and ``datasets`` directories, read with the ``datasets`` library."""
    import datasets

    datasets.disable_progress_bars()
    try:
        if fmt == "hf-disk":
            data = datasets.load_from_disk(str(path))
            if isinstance(data, datasets.DatasetDict):
                split = "train" if "train" in data else next(iter(data))
                data = data[split]
        else:
            data = datasets.Dataset.from_parquet(str(path), cache_dir=None, keep_in_memory=True)
    except Exception as err:  # the library's own reason, one line, naming the file
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TaskDataError(f"task.path: cannot read {path.name} as {fmt}: {reason}") from None
    return [(i + 1, record) for i, record in enumerate(data)]


def read_records(path: Path, fmt: str) -> list[tuple[int, dict | str]]:
    if not path.exists():
        raise TaskDataError(f"task.path: {path} does not exist")
    if path.is_file() and path.stat().st_size == 0:
        raise TaskDataError(f"task.path: {path.name} is empty")
    fmt = detect_format(path, fmt)
    if fmt == "jsonl":
        return _jsonl_records(path)
    if fmt == "csv":
        return _csv_records(path)
    return _table_records(path, fmt)


def _field_text(record: dict, key: str, knob: str, where: str) -> str:
    if key not in record or record[key] is None:
        raise TaskDataError(f"task.path: {where}: field {key!r} ({knob}) is missing")
    value = record[key]
    if isinstance(value, (dict, list)):
        raise TaskDataError(f"task.path: {where}: field {key!r} ({knob}) is a {type(value).__name__}, not text")
    text = str(value)
    if knob == "task.prompt_field" and not text.strip():
        raise TaskDataError(f"task.path: {where}: field {key!r} ({knob}) is empty")
    return text


def to_row(number: int, record: dict | str, cfg: TaskConfig, label: str) -> Row:
    if isinstance(record, str):
        raise TaskDataError(record)
    where = f"{label} {number}"
    prompt = _field_text(record, cfg.prompt_field, "task.prompt_field", where)
    try:
        answer = _field_text(record, cfg.answer_field, "task.answer_field", where)
    except TaskDataError:
        if cfg.on_bad_data == "error":
            raise
        answer = None  # kept: its trajectories score 0 and are counted (task/missing_answers)
    return Row(where, prompt, answer, record)


def load_rows(cfg: TaskConfig) -> DataRows:
    """Every usable row of ``task.path`` (``split`` then holds out the eval rows)."""
    path = resolve_path(cfg.path or "")
    records = read_records(path, cfg.format)
    label = "line" if detect_format(path, cfg.format) in ("jsonl", "csv") else "row"
    label = f"{path.name} {label}"
    if not records:
        raise TaskDataError(f"task.path: {path.name} has no rows")
    rows, skipped, reasons = [], 0, []
    for number, record in records:
        try:
            rows.append(to_row(number, record, cfg, label))
        except TaskDataError as err:
            if cfg.on_bad_data == "error":
                raise
            skipped += 1
            if len(reasons) < KEPT_REASONS:
                reasons.append(str(err))
    if not rows:
        raise TaskDataError(f"task.path: {path.name} has no usable row ({skipped} skipped; first: {reasons[0]})")
    return DataRows(train=rows, eval=[], skipped=skipped, reasons=reasons)


def split(rows: DataRows, eval_fraction: float, seed: int) -> DataRows:
    """Hold out ``round(eval_fraction · n)`` rows (at least one when the fraction is > 0),
    drawn with the run seed; the rest, in file order, are the training rows."""
    n = len(rows.train)
    n_eval = max(1, round(eval_fraction * n)) if eval_fraction > 0 else 0
    if n_eval >= n:
        raise TaskDataError(f"task.eval_fraction: {eval_fraction} of {n} rows leaves no training row")
    held = set(random.Random(f"eval-split-{seed}").sample(range(n), n_eval))
    train = [r for i, r in enumerate(rows.train) if i not in held]
    evals = [r for i, r in enumerate(rows.train) if i in held]
    return DataRows(train=train, eval=evals, skipped=rows.skipped, reasons=rows.reasons)


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool) -> list[int]:
    """The order of the training rows in ``epoch``: a fresh permutation per (seed, epoch)."""
    order = list(range(n))
    if shuffle:
        random.Random(f"epoch-{seed}-{epoch}").shuffle(order)
    return order
