"""The Celery app. Configuration comes from Django settings (``CELERY_*`` names).

Production worker: ``celery -A controller worker -Q runs --prefetch-multiplier 1``.
Embedded: ``manage.py demo`` runs a worker thread inside the web process.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controller.settings.embedded")

app = Celery("controller")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["controller"])
