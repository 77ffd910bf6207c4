"""Downloads of a run (trace.json, metrics.csv) streamed with bounded memory.

Rows come from a server-side cursor (``QuerySet.iterator``: a named cursor on PostgreSQL,
``EXPORT_CHUNK_ROWS`` rows per fetch) and leave as text chunks, so a run of millions of spans
never exists whole in the web process. Under ASGI the chunks are produced one at a time
in the sync thread (Django would otherwise collect a sync iterator into a list first).

The status line is sent before the rows are read, so a database connection lost mid-stream
cannot become a 503: the rows are read again from a fresh connection after the last key
sent (each export walks a unique key), waiting up to ``DB_WAIT_S`` for the database. An
error escaping a started response would leave daphne's connection open with no end (the
client waits forever), so past that wait the download ends early with a logged warning (a
cut trace.json is not valid JSON).
"""

import csv
import logging
import time
from collections.abc import Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import StreamingHttpResponse

from learner.chrome_trace import stream_trace

from controller.models import Run, Span, StepMetric
from controller.limits.outages import DB_ERRORS, first_line
from controller.jsonapi.serializers import SPAN_FIELDS

log = logging.getLogger(__name__)
EXPORT_CHUNK_ROWS = 5000
DB_WAIT_S = 30.0  # how long a download waits for a lost database connection to come back
DB_PAUSE_S = 0.05  # first pause between attempts, doubled up to 1 s


class StreamCut(Exception):
    """The database stayed away longer than DB_WAIT_S in the middle of a download."""


def rows_after(queryset, key: str, index=None) -> Iterator:
    """``queryset`` ordered by its unique ``key``, read again after the last row handed out
    when the connection is lost (``index``: the key's position in a values_list row; None:
    rows are dicts)."""
    last, deadline, pause = None, None, DB_PAUSE_S
    while True:
        rows = queryset if last is None else queryset.filter(**{f"{key}__gt": last})
        try:
            for row in rows.order_by(key).iterator(chunk_size=EXPORT_CHUNK_ROWS):
                last, deadline, pause = (row[key] if index is None else row[index]), None, DB_PAUSE_S
                yield row
            return
        except DB_ERRORS as err:
            connection.close()  # the broken one; the next query opens a new one
            deadline = deadline or time.monotonic() + DB_WAIT_S
            if time.monotonic() > deadline:
                raise StreamCut(first_line(err)) from err
            log.warning("download: the database connection was lost (%s); reading on %s", first_line(err),
                        "from the start" if last is None else f"after {key} {last}")
            time.sleep(pause)
            pause = min(2 * pause, 1.0)


def _next_or_end(chunks: Iterator[str]) -> str | None:
    """The next chunk, or None at the end; an error ends the download (see the module doc)."""
    try:
        return next(chunks, None)
    except StreamCut as err:
        log.warning("download: the database stayed unreachable for %.0fs (%s); the download ends early",
                    DB_WAIT_S, err)
    except Exception:
        log.exception("download: failed after its status line was sent; the download ends early")
    return None


async def _one_at_a_time(chunks: Iterator[str]):
    next_chunk = sync_to_async(_next_or_end, thread_sensitive=True)
    try:
        while (chunk := await next_chunk(chunks)) is not None:
            yield chunk
    finally:
        await sync_to_async(chunks.close, thread_sensitive=True)()


def download(request, chunks: Iterator[str], content_type: str, filename: str) -> StreamingHttpResponse:
    content = _one_at_a_time(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def trace_chunks(run: Run, step_filters: dict) -> Iterator[str]:
    """Chrome Trace JSON of the run's spans (learner.chrome_trace), ``step_filters`` applied."""
    spans = Span.objects.filter(run=run, **step_filters)
    lanes = list(spans.order_by().values_list("lane", flat=True).distinct())
    return stream_trace(rows_after(spans.values(*SPAN_FIELDS), "seq"), lanes, run_name=str(run))


class _Line:
    """csv.writer target that hands back what it was given."""

    def write(self, text: str) -> str:
        return text


def metrics_csv_chunks(run: Run) -> Iterator[str]:
    """``step`` then one column per metric name (sorted); two passes, the first for names."""
    metrics = StepMetric.objects.filter(run=run).values_list("step", "values")
    names: set[str] = set()
    for _, values in rows_after(metrics, "step", index=0):
        names.update(values)
    columns = sorted(names)
    writer = csv.writer(_Line())
    yield writer.writerow(["step", *columns])
    batch = []
    for step, values in rows_after(metrics, "step", index=0):
        batch.append(writer.writerow([step, *(values.get(name, "") for name in columns)]))
        if len(batch) >= EXPORT_CHUNK_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)
