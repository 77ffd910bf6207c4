"""Downloads of a run (trace.json, metrics.csv) streamed with bounded memory.

Rows come from a server-side cursor (``QuerySet.iterator``: a named cursor on PostgreSQL,
``EXPORT_CHUNK_ROWS`` rows per fetch) and leave as text chunks, so a run of millions of spans
never exists whole in the web process. Under ASGI the chunks are produced one at a time
in the sync thread (Django would otherwise collect a sync iterator into a list first).
"""

import csv
from collections.abc import Iterator

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse

from learner.chrome_trace import stream_trace

from .models import Run, Span, StepMetric
from .serializers import SPAN_FIELDS

EXPORT_CHUNK_ROWS = 5000


async def _one_at_a_time(chunks: Iterator[str]):
    next_chunk = sync_to_async(lambda: next(chunks, None), thread_sensitive=True)
    try:
        while (chunk := await next_chunk()) is not None:
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
    rows = spans.order_by("seq").values(*SPAN_FIELDS).iterator(chunk_size=EXPORT_CHUNK_ROWS)
    return stream_trace(rows, lanes, run_name=str(run))


class _Line:
    """csv.writer target that hands back what it was given."""

    def write(self, text: str) -> str:
        return text


def metrics_csv_chunks(run: Run) -> Iterator[str]:
    """``step`` then one column per metric name (sorted); two passes, the first for names."""
    metrics = StepMetric.objects.filter(run=run).order_by("step")
    names: set[str] = set()
    for values in metrics.values_list("values", flat=True).iterator(chunk_size=EXPORT_CHUNK_ROWS):
        names.update(values)
    columns = sorted(names)
    writer = csv.writer(_Line())
    yield writer.writerow(["step", *columns])
    batch = []
    for step, values in metrics.values_list("step", "values").iterator(chunk_size=EXPORT_CHUNK_ROWS):
        batch.append(writer.writerow([step, *(values.get(name, "") for name in columns)]))
        if len(batch) >= EXPORT_CHUNK_ROWS:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)
