"""JSON error responses: ``{"errors": {"field": "reason"}}`` with a 4xx status."""

from django.http import JsonResponse
from django.shortcuts import render
from django.views.csrf import csrf_failure as page_csrf_failure


class ApiError(Exception):
    def __init__(self, status: int, errors: dict[str, str]):
        super().__init__(errors)
        self.status = status
        self.errors = errors


def json_error(status: int, errors: dict[str, str]) -> JsonResponse:
    return JsonResponse({"errors": errors}, status=status)


def form_errors(form) -> dict[str, str]:
    """Django form errors as one reason per field (``__all__`` becomes ``request``)."""
    return {("request" if field == "__all__" else field): "; ".join(messages)
            for field, messages in form.errors.items()}


def csrf_failure(request, reason=""):
    if request.path.startswith("/api/"):
        return json_error(403, {"csrf": f"CSRF check failed: {reason}"})
    return page_csrf_failure(request, reason)


# what a page path names, for the 404 page's one line (``/runs/12/`` -> "run #12")
PAGE_KINDS = {"runs": "run", "experiments": "experiment", "comparisons": "comparison", "schedules": "schedule preset"}


def not_found_reason(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    kind = PAGE_KINDS.get(parts[0]) if parts else None
    if kind and len(parts) > 1:
        if not parts[1].isdigit():
            return f"{path}: “{parts[1]}” is not a {kind} id (a number)."
        return f"{path}: no {kind} #{parts[1]} among yours (it does not exist, was deleted, or is another user's)."
    return f"{path}: no such page."


def not_found(request, exception=None):
    """handler404: a path under /api/ that no route matches (``/api/runs/abc/``) gets JSON
    like every other API error; a page gets the app's own page, saying what was not found."""
    if request.path.startswith("/api/"):
        return json_error(404, {"path": "no such API path"})
    return render(request, "404.html", {"reason": not_found_reason(request.path)}, status=404)
