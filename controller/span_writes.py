"""Writing a flush's spans: the hot write of a live run (hundreds of spans a step).

On PostgreSQL one ``INSERT ... SELECT FROM unnest(arrays) ON CONFLICT DO NOTHING`` carries a
whole batch as one array per column: no model instance and no per-row SQL is built, which is
most of what ``bulk_create`` spent (measured with py-spy on the production Celery worker during
a streaming run: ``bulk_create`` of the spans was a third of the worker's CPU; docs/controller.md,
"Span ingestion"). Elsewhere (SQLite, the embedded default) ``bulk_create`` with
``ignore_conflicts``. Both skip a span whose (run, seq) is stored already, so re-ingesting a
line stays harmless.
"""

from django.db import connection

from .models import Span
from .serializers import SPAN_FIELDS

# Span columns after run_id, with the PostgreSQL array type each is sent as.
COLUMN_TYPES = {"seq": "integer", "step": "integer", "kind": "text", "t0": "double precision",
                "t1": "double precision", "lane": "text", "traj": "integer", "group": "integer",
                "turn": "integer", "policy_version": "integer", "tokens": "integer"}
assert tuple(COLUMN_TYPES) == SPAN_FIELDS
BATCH = 5000  # rows per statement: bounded parameter size on a replay of a long run


def _insert_sql() -> str:
    fields = {f.name: f.column for f in Span._meta.concrete_fields}
    quote = connection.ops.quote_name
    columns = ", ".join(quote(fields[name]) for name in ("run", *COLUMN_TYPES))
    arrays = ", ".join(f"%s::{kind}[]" for kind in COLUMN_TYPES.values())
    return (f"INSERT INTO {quote(Span._meta.db_table)} ({columns}) SELECT %s, * FROM unnest({arrays}) "
            "ON CONFLICT DO NOTHING")


def write_spans(run_id: int, rows: list[dict]) -> None:
    """Store validated span rows (``SPAN_FIELDS`` each) of one run, in the caller's transaction."""
    if not rows:
        return
    if connection.vendor != "postgresql":
        Span.objects.bulk_create([Span(run_id=run_id, **row) for row in rows], ignore_conflicts=True,
                                 batch_size=1000)
        return
    sql = _insert_sql()
    with connection.cursor() as cursor:
        for start in range(0, len(rows), BATCH):
            batch = rows[start:start + BATCH]
            cursor.execute(sql, [run_id, *([row[name] for row in batch] for name in COLUMN_TYPES)])
