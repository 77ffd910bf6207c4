"""Small decorators for the JSON API views (healthchecks.io style, no framework)."""

import json
from functools import wraps

from django.core.exceptions import RequestDataTooBig
from django.http import Http404

from .api_errors import ApiError, json_error


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


def read_json(request, allowed_fields) -> dict:
    """The request body as a JSON object holding only ``allowed_fields``; else ApiError."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise ApiError(413, {"body": "request body too large"}) from None
    try:
        payload = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(400, {"body": f"malformed JSON: {err}"}) from None
    if not isinstance(payload, dict):
        raise ApiError(400, {"body": f"expected a JSON object, got {type(payload).__name__}"})
    unknown = sorted(set(payload) - set(allowed_fields))
    if unknown:
        raise ApiError(400, {name: "unknown field" for name in unknown})
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
