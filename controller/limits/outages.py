"""Infrastructure outages answer 503 with Retry-After, never a 500.

A request that meets PostgreSQL or Redis down (a restart, backends terminated, the broker
unreachable) gets ``503 Service Unavailable`` with ``Retry-After``: JSON
``{"errors": {"service": ...}}`` under ``/api/``, a small self-contained page elsewhere (it
reads nothing from the database, which may be the thing that is down). A request meets no
connection within about THUNDERSYNC_DB_DOWN_WAIT_S once the pool knows the database is down
(controller/postgres/base.py), so the 503 comes at once, not after the pool's full wait. The middleware
answers what a view raises; ``server_error`` (handler500) answers what another middleware
raised, e.g. saving the session; any other error keeps Django's 500.
"""

from __future__ import annotations

import logging
import sys
import time
from html import escape

import kombu.exceptions
import psycopg
import redis.exceptions
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpResponse
from django.templatetags.static import static
from django.views.defaults import server_error as django_server_error

from controller.jsonapi.api_errors import json_error
from controller.postgres.base import DatabaseUnreachable

log = logging.getLogger(__name__)
RETRY_AFTER_S = 5
DB_RETRIES = 2
DB_RETRY_PAUSE_S = 0.05  # times the attempt: a restarting database gets a moment
# What a lost database or broker raises: Django wraps psycopg's errors (AdminShutdown is an
# OperationalError); kombu's publish raises its OperationalError; Django's Redis cache raises
# redis-py's own; a refused socket can surface as the builtin ConnectionError. psycopg's own
# errors escape unwrapped where Django closes a server-side cursor (QuerySet.iterator).
DB_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
OUTAGE_ERRORS = (*DB_ERRORS, kombu.exceptions.OperationalError, redis.exceptions.ConnectionError,
                 redis.exceptions.TimeoutError, ConnectionError)
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Unavailable · ThunderSync Lab</title>
<link rel="stylesheet" href="{css}"></head>
<body><header class="topbar"><a class="brand" href="/">ThunderSync Lab</a></header>
<main><h1>Temporarily unavailable</h1><p>The {what} cannot be reached right now. Nothing was
lost: try again in a few seconds.</p></main></body></html>
"""


def no_connection(err: BaseException) -> bool:
    """The pool knows the database is down (controller/postgres/base.py): asking again at once
    gets no other answer, unlike a connection cut under a query or a pool whose connections were
    all busy for its wait."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, DatabaseUnreachable):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def what_is_down(err: BaseException) -> str:
    return "database" if isinstance(err, DB_ERRORS) else "message broker"


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def outage_response(request, err: BaseException) -> HttpResponse:
    what = what_is_down(err)
    log.warning("%s %s: the %s is unreachable (%s): answering 503", request.method, request.path, what, first_line(err))
    if request.path.startswith("/api/"):
        response = json_error(503, {"service": f"the {what} is unreachable; try again in {RETRY_AFTER_S}s"})
    else:
        response = HttpResponse(PAGE.format(css=escape(static("css/app.css")), what=what), status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


class OutageMiddleware:
    """Answer an outage a view raised with 503 (see the module doc). A GET or HEAD whose
    database connection was cut (a restart, a terminated backend) is first run again on a
    fresh connection, up to DB_RETRIES times: reading twice is harmless, and a flapping
    database then mostly answers 200. Other methods are not repeated (they may have written)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        request.outage_view = (view_func, view_args, view_kwargs)
        return None

    def process_exception(self, request, exception):
        if not isinstance(exception, OUTAGE_ERRORS):
            return None
        view = getattr(request, "outage_view", None)
        if (view is not None and request.method in ("GET", "HEAD") and isinstance(exception, DB_ERRORS)
                and not no_connection(exception)):
            for attempt in range(1, DB_RETRIES + 1):
                connection.close()  # the broken one; the next query opens a new one
                log.warning("%s %s: the database connection was lost (%s); trying again (%d/%d)", request.method,
                            request.path, first_line(exception), attempt, DB_RETRIES)
                time.sleep(DB_RETRY_PAUSE_S * attempt)
                try:
                    return view[0](request, *view[1], **view[2])
                except DB_ERRORS as err:
                    exception = err
                    if no_connection(err):
                        break
        return outage_response(request, exception)


def server_error(request):
    """handler500: an outage raised outside a view still answers 503."""
    err = sys.exc_info()[1]
    if isinstance(err, OUTAGE_ERRORS):
        return outage_response(request, err)
    return django_server_error(request)
