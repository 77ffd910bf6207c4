"""The ThunderSync Lab web app: experiments, schedules, runs, live timelines."""

from controller.celery import app as celery_app

__all__ = ["celery_app"]
