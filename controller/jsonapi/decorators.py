"""Small decorators for the JSON API views (healthchecks.io style, no framework) and the
pages' form targets."""

import json
from functools import wraps

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from django.shortcuts import render
from django.urls import Resolver404, resolve

from controller.jsonapi.api_errors import ApiError, json_error
from controller.limits.limits import MAX_JSON_DEPTH, nesting_depth


def api_view(*methods: str):
    """Login required (401), allowed methods (405), ApiError and Http404 as JSON errors."""

    def decorate(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return json_error(401, {"auth": "login required"})
            if request.method not in methods:
                response = json_error(405, {"method": f"{request.method} not allowed, use {' or '.join(methods)}"})
                response["Allow"] = ", ".join(methods)
                return response
            try:
                return view(request, *args, **kwargs)
            except ApiError as err:
                return json_error(err.status, err.errors)
            except Http404:
                return json_error(404, {"id": "not found"})

        return wrapper

    return decorate


def page_above(path: str) -> str:
    """The nearest page above ``path`` that exists (``/runs/3/cancel/`` -> ``/runs/3/``,
    ``/schedules/4/delete/`` -> ``/schedules/``)."""
    while path not in ("", "/"):
        path = path.rstrip("/").rsplit("/", 1)[0] + "/"
        try:
            resolve(path)
            return path
        except Resolver404:
            continue
    return "/"


def form_post(view):
    """A page's form target: POST only. Any other method (an address left in the bar after a
    form's error, a bookmark) gets a styled 405 page with ``Allow: POST`` and a link to the page
    the form lives on (the address without its last part), instead of the browser's blank one."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method != "POST":
            back = page_above(request.path)
            response = render(request, "405.html", {"method": request.method, "path": request.path, "back": back},
                              status=405)
            response["Allow"] = "POST"
            return response
        return view(request, *args, **kwargs)

    return wrapper


JSON_TYPE_NAMES = {str: "a string", int: "an integer", dict: "a JSON object", list: "a JSON array"}
def read_json(request, fields: dict[str, tuple[type, ...]]) -> dict:
    """The request body as a JSON object whose keys are in ``fields`` and whose values have
    one of the listed JSON types (no silent coercion: 5.0 is not an integer); else ApiError."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, {"body": "request body too large"}) from None
    try:
        payload = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, {"body": f"malformed JSON: {err}"}) from None
    except RecursionError:
        raise ApiError(400, {"body": f"nested deeper than {MAX_JSON_DEPTH} levels"}) from None
    if nesting_depth(payload) > MAX_JSON_DEPTH:
        # Configs are a few levels deep; deeper input would only exhaust the stack later.
        raise ApiError(400, {"body": f"nested deeper than {MAX_JSON_DEPTH} levels"})
    if not isinstance(payload, dict):
        raise ApiError(400, {"body": f"expected a JSON object, got {type(payload).__name__}"})
    errors = {name: "unknown field" for name in payload if name not in fields}
    for name, value in payload.items():
        types = fields.get(name, ())
        if name not in errors and (isinstance(value, bool) or not isinstance(value, types)):
            errors[name] = "expected " + " or ".join(JSON_TYPE_NAMES[t] for t in types)
    if errors:
        raise ApiError(400, errors)
    return payload


def int_param(request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    """An integer query parameter within [lo, hi]; ApiError names it otherwise."""
    raw = request.GET.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, {name: f"expected an integer, got {raw[:40]!r}"}) from None
    if not lo <= value <= hi:
        raise ApiError(400, {name: f"must be between {lo} and {hi}"})
    return value
