"""The Django app's configuration."""

from django.apps import AppConfig


class ControllerConfig(AppConfig):
    name = "controller"
    verbose_name = "ThunderSync Lab"
