"""ASGI entry point: HTTP (with static files) and the run websockets.

Static files are served by Django's ASGI static handler so the embedded server and the
production container need nothing in front of them (plotly.min.js included).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controller.settings.embedded")
django_http = get_asgi_application()  # sets up Django before the imports below touch models

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from django.conf import settings  # noqa: E402

from controller.limits import body_limit  # noqa: E402
from controller.live.origins import ExactOriginValidator  # noqa: E402
from controller.supervision.ownership import start_reaper  # noqa: E402
from controller.routing import websocket_urlpatterns  # noqa: E402

body_limit.install(settings.THUNDERSYNC_MAX_REQUEST_BYTES)  # before daphne buffers a body (controller/limits/body_limit.py)
application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_http),
        "websocket": ExactOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
if settings.THUNDERSYNC_WEB_REAPER:
    # A run never waits for a worker to come back: the web process reaps too (docs/controller.md).
    start_reaper()
