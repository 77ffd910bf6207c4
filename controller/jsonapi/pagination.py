"""Pages of the JSON API's lists: one convention for every list endpoint (docs/web-contract.md).

``?limit=`` (1..the endpoint's maximum; default the endpoint's default) and ``?offset=`` (0..)
select a slice of the list in its documented order; the answer carries the slice under the
list's key and ``count`` (every item the filters keep), ``limit``, ``offset``, ``next`` and
``previous`` (the path and query of the neighbouring page, null at either end). An item
created or deleted between two requests shifts later pages by one: read a list that changes
while it is read (a run's spans) with its cursor instead (``after``/``last_seq``).
"""

from collections.abc import Callable, Sequence

from controller.jsonapi.api_errors import ApiError
from controller.jsonapi.decorators import int_param
from controller.limits.limits import INT32_MAX

DEFAULT_PAGE = 100  # experiments, schedules, runs, comparisons
MAX_PAGE = 500
MAX_METRICS_PAGE = 10_000  # a run's per-step metrics: the default steps quota, one page


def page_bounds(request, default: int = DEFAULT_PAGE, maximum: int = MAX_PAGE) -> tuple[int, int]:
    """``(limit, offset)`` from the query; ApiError (400) naming the parameter when out of range or
    given empty (``?limit=`` is not the default: absent is)."""
    for name in ("limit", "offset"):
        if request.GET.get(name, None) == "":
            raise ApiError(400, {name: "expected an integer, got ''"})
    limit = int_param(request, "limit", default, 1, maximum)
    offset = int_param(request, "offset", 0, 0, INT32_MAX)
    return limit, offset


def link(request, limit: int, offset: int) -> str:
    params = request.GET.copy()
    params["limit"], params["offset"] = str(limit), str(offset)
    return f"{request.path}?{params.urlencode()}"


def paged(request, queryset, key: str, to_json: Callable[[Sequence], list], default: int = DEFAULT_PAGE,
          maximum: int = MAX_PAGE) -> dict:
    """One page of ``queryset`` (ordered) as ``{key: to_json(items), count, limit, offset, next, previous}``."""
    limit, offset = page_bounds(request, default, maximum)
    count = queryset.count()
    items = list(queryset[offset:offset + limit]) if offset < count else []
    return {
        key: to_json(items), "count": count, "limit": limit, "offset": offset,
        "next": link(request, limit, offset + limit) if offset + limit < count else None,
        "previous": link(request, limit, max(offset - limit, 0)) if offset > 0 else None,
    }
