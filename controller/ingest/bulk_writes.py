"""The writes of a live run's flush (``write_batch``: everything it reported since the last one),
and the hot ones among them: its spans (hundreds a step) and trajectory records (one per
trajectory, with its text), as one statement per flush.

On PostgreSQL one ``INSERT ... SELECT FROM unnest(one array per column) ON CONFLICT ...`` carries a
whole batch: no model instance, no per-row SQL, and the parameters are bound server-side, so
psycopg's C dumpers send them. Django's default (client-side binding) cursor quotes every value
into the SQL text in Python, which is most of what ``bulk_create`` spent: ingesting the events of
three 128-trajectory streaming steps took 0.548 CPU s with ``bulk_create``, 0.316 s with the
span insert below and less with both (docs/controller.md, "Span ingestion"). Elsewhere (SQLite, the
embedded default) ``bulk_create``. Conflicts resolve as before: a span already stored keeps its
first row (re-ingesting a line is harmless), a trajectory record is replaced (a resumed run
re-sends it).
"""

import json

import psycopg
from django.db import connection

from controller.models import Checkpoint, Run, Span, StepMetric, SystemSample, TrajectoryRecord
from controller.jsonapi.serializers import SPAN_FIELDS

# Columns after run_id with the PostgreSQL type each column's array is sent as; jsonb goes as
# text (JSON-encoded here) and is cast per row.
SPAN_TYPES = {"seq": "integer", "step": "integer", "kind": "text", "t0": "double precision",
              "t1": "double precision", "lane": "text", "traj": "integer", "group": "integer",
              "turn": "integer", "policy_version": "integer", "tokens": "integer"}
assert tuple(SPAN_TYPES) == SPAN_FIELDS
TRAJECTORY_TYPES = {"step": "integer", "traj": "integer", "group": "integer", "reward": "double precision",
                    "advantage": "double precision", "zero_gradient": "boolean", "turns": "integer",
                    "tokens": "integer", "drafted": "boolean", "error": "text", "versions": "jsonb",
                    "segments": "jsonb"}
BATCH = 5000  # rows per statement: bounded parameters on a replay of a long run


def _insert_sql(model, types: dict[str, str], conflict: str) -> str:
    columns = {f.name: f.column for f in model._meta.concrete_fields}
    quote = connection.ops.quote_name
    names = ", ".join(quote(columns[name]) for name in ("run", *types))
    arrays = ", ".join(f"%s::{'text' if kind == 'jsonb' else kind}[]" for kind in types.values())
    picked = ", ".join(f"u.{quote(columns[n])}::jsonb" if kind == "jsonb" else f"u.{quote(columns[n])}"
                       for n, kind in types.items())
    unnamed = ", ".join(quote(columns[n]) for n in types)
    return (f"INSERT INTO {quote(model._meta.db_table)} ({names}) SELECT %s, {picked} "
            f"FROM unnest({arrays}) AS u({unnamed}) {conflict}")


def _insert(model, run_id: int, rows: list[dict], types: dict[str, str], conflict: str) -> None:
    sql = _insert_sql(model, types, conflict)
    connection.ensure_connection()
    # Django's own connection, so inside its transaction; a server-side-binding cursor. Django's
    # wrapper turns psycopg's errors into its own (a lost connection is an OperationalError the
    # supervisor retries, as on every other write).
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        for start in range(0, len(rows), BATCH):
            batch = rows[start:start + BATCH]
            columns = [[json.dumps(row[n]) if kind == "jsonb" else row[n] for row in batch]
                       for n, kind in types.items()]
            cursor.execute(sql, [run_id, *columns])


def write_spans(run_id: int, rows: list[dict]) -> None:
    """Store validated span rows (``SPAN_FIELDS`` each) of one run, in the caller's transaction."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        Span.objects.bulk_create([Span(run_id=run_id, **row) for row in rows], ignore_conflicts=True,
                                 batch_size=1000)
        return
    _insert(Span, run_id, rows, SPAN_TYPES, "ON CONFLICT DO NOTHING")


def write_trajectories(records: list[TrajectoryRecord]) -> None:
    """Store trajectory records (of one run), replacing any stored under the same (run, traj)."""
    if not records:
        return
    if connection.vendor != "postgresql":
        TrajectoryRecord.objects.bulk_create(records, update_conflicts=True, unique_fields=["run", "traj"],
                                             update_fields=[n for n in TRAJECTORY_TYPES if n != "traj"],
                                             batch_size=500)
        return
    by_run: dict[int, list[dict]] = {}
    for rec in records:
        by_run.setdefault(rec.run_id, []).append({n: getattr(rec, n) for n in TRAJECTORY_TYPES})
    columns = {f.name: f.column for f in TrajectoryRecord._meta.concrete_fields}
    quote = connection.ops.quote_name
    updates = ", ".join(f"{quote(columns[n])} = EXCLUDED.{quote(columns[n])}" for n in TRAJECTORY_TYPES if n != "traj")
    conflict = f"ON CONFLICT ({quote(columns['run'])}, {quote(columns['traj'])}) DO UPDATE SET {updates}"
    for run_id, rows in by_run.items():
        _insert(TrajectoryRecord, run_id, rows, TRAJECTORY_TYPES, conflict)


def write_batch(run_id: int, batch) -> None:
    """Store a ``run_events.Batch`` of one run, in the caller's transaction: spans and checkpoints
    already stored are kept, a step's metrics and a trajectory's record are replaced, and a run
    that said "started" goes from STARTING to RUNNING."""
    write_spans(run_id, batch.spans)
    StepMetric.objects.bulk_create(
        [StepMetric(run_id=run_id, step=step, values=values) for step, values in batch.metrics.items()],
        update_conflicts=True, unique_fields=["run", "step"], update_fields=["values"],
    )
    Checkpoint.objects.bulk_create(batch.checkpoints, ignore_conflicts=True)
    SystemSample.objects.bulk_create([SystemSample(run_id=run_id, **x) for x in batch.system])
    write_trajectories(batch.trajectories)
    if batch.became_running:
        Run.objects.filter(pk=run_id, status=Run.Status.STARTING).update(status=Run.Status.RUNNING)
