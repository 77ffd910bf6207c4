"""Exact origin check for the run websockets: scheme, host and port, as CSRF checks them.

Channels' ``AllowedHostsOriginValidator`` compares host names only, so a page served from
another port or scheme of an allowed host could open a user's run socket with their
cookies. Here the ``Origin`` must equal the socket's own origin (the ``Host`` it was opened
on, ``http``/``https`` for ``ws``/``wss``, behind a proxy per ``SECURE_PROXY_SSL_HEADER``),
with that host in ``ALLOWED_HOSTS``, or be listed in ``CSRF_TRUSTED_ORIGINS``: the same rule
Django's CSRF middleware applies to unsafe HTTP requests (docs/controller-api.md, "Websocket").
"""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_key(origin: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin, the port made explicit; None when malformed."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def trusted(key: tuple[str, str, int], entry: str) -> bool:
    """``key`` matches a CSRF_TRUSTED_ORIGINS entry (``https://*.example.com`` style allowed)."""
    wildcard = "://*." in entry
    wanted = origin_key(entry.replace("://*.", "://", 1) if wildcard else entry)
    if wanted is None:
        return False
    scheme, host, port = key
    if (scheme, port) != (wanted[0], wanted[2]):
        return False
    return host == wanted[1] or (wildcard and host.endswith("." + wanted[1]))


def socket_origin(scope) -> tuple[str, str, int] | None:
    """The origin the socket itself was opened on, if its Host header is an allowed host."""
    headers = dict(scope.get("headers", []))
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _ = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    secure = scope.get("scheme") == "wss"
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:  # ("HTTP_X_FORWARDED_PROTO", "https") -> header x-forwarded-proto
        name = proxy[0].removeprefix("HTTP_").lower().replace("_", "-").encode()
        secure = secure or headers.get(name, b"").decode("latin-1").split(",")[0].strip() == proxy[1]
    return origin_key(("https://" if secure else "http://") + host)


def origin_allowed(scope) -> bool:
    raw = dict(scope.get("headers", [])).get(b"origin")
    key = origin_key(raw.decode("latin-1")) if raw else None
    if key is None:  # browsers always send Origin on a websocket handshake
        return False
    if key == socket_origin(scope):
        return True
    return any(trusted(key, entry) for entry in getattr(settings, "CSRF_TRUSTED_ORIGINS", []))


class ExactOriginValidator:
    """ASGI middleware: a websocket from any other origin is refused at the handshake (403)."""

    def __init__(self, application):
        self.application = application
        self.denier = WebsocketDenier.as_asgi()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await self.denier(scope, receive, send)
        return await self.application(scope, receive, send)
