"""Daphne entry point for the browser tests and web benches: the real ASGI app
(controller.asgi) on the test settings, pointed at the test database that the parent
process (pytest-django or a bench) created. The parent passes THUNDERSYNC_TEST_TAG through
the environment, so both sides derive the same test database name."""

import os

from django.conf import settings

if os.environ.get("DJANGO_SETTINGS_MODULE") != "controller.settings.test":
    raise RuntimeError("tests.harness.web_asgi serves the test database: set DJANGO_SETTINGS_MODULE=controller.settings.test")
# pytest-xdist workers' test databases carry a suffix of pytest-django's: the parent passes the
# exact name (THUNDERSYNC_TEST_DATABASE, already applied by the settings).
if not os.environ.get("THUNDERSYNC_TEST_DATABASE"):
    settings.DATABASES["default"]["NAME"] = settings.DATABASES["default"]["TEST"]["NAME"]

from controller.asgi import application  # noqa: E402,F401  (sets Django up with the name above)
