"""Login throttling that slows guessing without locking the owner out.

Failures are counted per (account, client address) and per client address. Once a scope has
``THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ACCOUNT`` (pair) or ``..._PER_ADDRESS`` failures, each
further attempt from it must wait a cool-down after the last failure
(``THUNDERSYNC_LOGIN_COOLDOWN_S``, doubled with every failure past the limit, at most
``THUNDERSYNC_LOGIN_WINDOW_S``); an attempt within the cool-down answers 429 without checking
the password. The owner logging in from another address is never slowed by an attacker's
failures, and one who shares the attacker's address waits at most one cool-down. Counters
expire ``THUNDERSYNC_LOGIN_WINDOW_S`` after the last failure; a success clears its pair.

Counters live in Django's cache (Redis in production, shared by every web process). When
the cache is unreachable the throttle fails open with a logged warning: logins keep working
without Redis. Both the site's login and the admin's go through these forms
(docs/controller-api.md, "Security and fair use").
"""

from __future__ import annotations

import hashlib
import logging
import time

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.views import LoginView
from django.core.cache import cache
from django.core.exceptions import ValidationError

log = logging.getLogger(__name__)
THROTTLED = "throttled"


def client_address(request) -> str:
    """REMOTE_ADDR, or behind a reverse proxy the header it sets (e.g. X-Real-IP), named by
    ``THUNDERSYNC_CLIENT_IP_HEADER``: else every client would share the proxy's address."""
    header = settings.THUNDERSYNC_CLIENT_IP_HEADER
    forwarded = request.META.get(header, "") if header else ""
    return forwarded.split(",")[0].strip() or request.META.get("REMOTE_ADDR", "")


def _scopes(request, username: str) -> dict[str, tuple[str, int]]:
    """scope -> (cache key prefix, failure limit)."""
    account = hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]
    address = client_address(request) if request is not None else ""
    return {"account": (f"login-failures:pair:{account}:{address}", settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ACCOUNT),
            "address": (f"login-failures:address:{address}", settings.THUNDERSYNC_LOGIN_MAX_FAILURES_PER_ADDRESS)}


def cooldown_s(failures: int, limit: int) -> float:
    """How long after the last failure the next attempt must wait (0 below the limit)."""
    if failures < limit:
        return 0.0
    return min(settings.THUNDERSYNC_LOGIN_COOLDOWN_S * 2 ** min(failures - limit, 20),
               settings.THUNDERSYNC_LOGIN_WINDOW_S)


def _fail_open(what: str, err: Exception) -> None:
    log.warning("login throttle: the cache is unreachable (%s: %s); %s without throttling",
                what, type(err).__name__, "logins go on")


def throttled(request, username: str) -> str | None:
    """Why this login attempt is refused now, or None (also when the cache is down)."""
    scopes = _scopes(request, username)
    keys = [k for prefix, _ in scopes.values() for k in (prefix + ":n", prefix + ":last")]
    try:
        values = cache.get_many(keys)
    except Exception as err:  # any cache backend's connection error
        _fail_open("read", err)
        return None
    now = time.time()
    for scope, (prefix, limit) in scopes.items():
        wait = cooldown_s(values.get(prefix + ":n", 0), limit) - (now - values.get(prefix + ":last", 0.0))
        if wait > 0:
            what = "this account from your address" if scope == "account" else "your address"
            return f"Too many failed logins for {what}: try again in {wait:.0f} seconds."
    return None


def record_failure(request, username: str) -> None:
    window = settings.THUNDERSYNC_LOGIN_WINDOW_S
    try:
        for prefix, _ in _scopes(request, username).values():
            cache.add(prefix + ":n", 0, timeout=window)
            try:
                cache.incr(prefix + ":n")
            except ValueError:  # expired between add and incr
                cache.set(prefix + ":n", 1, timeout=window)
            cache.touch(prefix + ":n", timeout=window)
            cache.set(prefix + ":last", time.time(), timeout=window)
    except Exception as err:
        _fail_open("count a failure", err)


def record_success(request, username: str) -> None:
    prefix, _ = _scopes(request, username)["account"]
    try:
        cache.delete_many([prefix + ":n", prefix + ":last"])
    except Exception as err:
        _fail_open("clear a pair", err)


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


def with_throttle_status(response):
    """429 for a login page whose form was refused by the throttle (else as it was)."""
    form = (getattr(response, "context_data", None) or {}).get("form")
    if form is not None and form.has_error("__all__", THROTTLED):
        response.status_code = 429
    return response


class ThrottledLoginView(LoginView):
    authentication_form = ThrottledAuthenticationForm

    def form_invalid(self, form):
        return with_throttle_status(super().form_invalid(form))


def admin_login(request, extra_context=None):
    """The admin's login (its form is ThrottledAdminAuthenticationForm), 429 when throttled."""
    return with_throttle_status(admin.site.login(request, extra_context))
