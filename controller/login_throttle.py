"""Login throttling: after a few failed logins for one account, or many from one address,
further attempts are refused for a while without even checking the password.

Counters live in Django's cache (Redis in production, so every web process shares them) and
expire ``THUNDERSYNC_LOGIN_WINDOW_S`` after the first failure. Both the site's login and the
admin's go through these forms (docs/controller.md, "Security and fair use").
"""

import hashlib

from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError

THROTTLED = "throttled"


def client_address(request) -> str:
    """REMOTE_ADDR, or behind a reverse proxy the header it sets (e.g. X-Real-IP), named by
    ``THUNDERSYNC_CLIENT_IP_HEADER``: else every client would share the proxy's address."""
    header = settings.THUNDERSYNC_CLIENT_IP_HEADER
    forwarded = request.META.get(header, "") if header else ""
    return forwarded.split(",")[0].strip() or request.META.get("REMOTE_ADDR", "")


def _keys(request, username: str) -> dict[str, str]:
    account = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    address = client_address(request) if request is not None else ""
    return {"account": f"login-failures:account:{account}", "address": f"login-failures:address:{address}"}


def _limits() -> dict[str, int]:
    return {"account": settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ACCOUNT,
            "address": settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS}


def throttled(request, username: str) -> str | None:
    """Why logins for ``username`` from this request's address are refused now, or None."""
    counts = cache.get_many(list(_keys(request, username).values()))
    for scope, key in _keys(request, username).items():
        if counts.get(key, 0) >= _limits()[scope]:
            minutes = max(1, settings.THUNDERSYNC_LOGIN_WINDOW_S // 60)
            return (f"Too many failed logins for this {scope}: try again in up to {minutes} minutes.")
    return None


def record_failure(request, username: str) -> None:
    for key in _keys(request, username).values():
        cache.add(key, 0, timeout=settings.THUNDERSYNC_LOGIN_WINDOW_S)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, timeout=settings.THUNDERSYNC_LOGIN_WINDOW_S)


def record_success(request, username: str) -> None:
    cache.delete(_keys(request, username)["account"])


class ThrottledLoginMixin:
    def clean(self):
        username = self.data.get("username", "") if self.data else ""
        reason = throttled(self.request, username)
        if reason:
            raise ValidationError(reason, code=THROTTLED)
        try:
            cleaned = super().clean()
        except ValidationError:
            record_failure(self.request, username)
            raise
        record_success(self.request, username)
        return cleaned


class ThrottledAuthenticationForm(ThrottledLoginMixin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLoginMixin, AdminAuthenticationForm):
    pass


class ThrottledLoginView(LoginView):
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form):
        response = super().form_invalid(form)
        if form.has_error("__all__", THROTTLED):
            response.status_code = 429
        return response
