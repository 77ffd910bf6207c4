"""JSON error responses: ``{"errors": {"field": "reason"}}`` with a 4xx status."""

from django.http import JsonResponse
from django.views.csrf import csrf_failure as page_csrf_failure
from django.views.defaults import page_not_found as page_not_found_html


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


def not_found(request, exception=None):
    """handler404: a path under /api/ that no route matches (``/api/runs/abc/``) gets JSON
    like every other API error; pages keep Django's HTML 404."""
    if request.path.startswith("/api/"):
        return json_error(404, {"path": "no such API path"})
    return page_not_found_html(request, exception)
